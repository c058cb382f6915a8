"""RLHF book ch.9 Suggested Experiments (S9.1-S9.4): rejection sampling on the chapter-13 calculator.

    rs_cache            S9.1  generate and score the calculator's samples of the training problems once per
                              generation setting, into a rollout cache (`RolloutCache`, run_dir/rs_cache/rollouts/)
    rs_<selection>      S9.2  top_per_prompt / random_per_prompt / top_k_overall / random_k_overall on the main
                              setting's cache, each SFT'd from the cold start and evaluated on the 256 held-out sums
    rs_n<N>, rs_t<T>,   S9.3  top_per_prompt with another number of completions, temperature or top-p (each its
    rs_p<P>                   own cache entry)
    rs_n<N>_random      S9.3  a random pick per prompt at the other N: a scorer that cannot separate
    rs_weak             S9.4  a weaker calculator (fewer cold-start steps on fewer problems)
    rs_weak_top, rs_weak_random   the matched pair rerun from it

The scorer is the calculator's verifier (exact match: reward 1 or 0), the book's "RM" in its strongest form: it
separates right from wrong perfectly, so S9.3's "more completions help only if the RM can separate" is
checked on its "can separate" side.

How this departs from the book's companion code, and why:

1. GSM8K and a reward model become the calculator's held-out sums and its verifier (what a tiny model can do).
2. top_k_overall keeps as many samples as top_per_prompt (one per prompt on average), so every run of a pair
   and of the two pairs trains on the same number of samples.
3. Selection and SFT reuse the library (`algorithms.common.select_episodes`, `algorithms.sft.train_sft`); one
   round, SFT from the cold start on the kept samples (the companion code's one-shot RS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...algorithms.common import select_episodes
from ...algorithms.sft import SFTConfig, train_sft
from ...checkpoint import write_json
from ...envs.arithmetic import arithmetic_tokenizer, train_tasks
from ...models.tiny import load_model
from ...runs.plots import bar_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.verdicts import Estimate, paired, two_shares
from ...runs.stages import Stage
from ...seeding import derive
from ...sources.episodes import sample_episodes
from ...text.render import Renderer
from ...trajectory import Trajectory
from ..shared.calculator import answer_sampling, calc_model, demos, math_eval, source_for
from ...runs.verdicts import Part
from .evidence import cite, decide

SELECTIONS = {"top_per_prompt": ("top_per_prompt", False), "random_per_prompt": ("top_per_prompt", True),
              "top_k_overall": ("top_overall", False), "random_k_overall": ("top_overall", True)}
"""the book's four selections -> (select_episodes mode, random_control)"""


@dataclass
class Demo:
    """this chapter's settings"""

    tasks: int = 256
    """training problems sampled (each `n` times)"""
    n: int = 8
    """completions per problem (the main setting)"""
    temperature: float = 1.0
    """sampling temperature (the main setting)"""
    top_p: float = 1.0
    """nucleus sampling (the main setting)"""
    sweep_n: list[int] = field(default_factory=lambda: [2, 32])
    """S9.3: other numbers of completions"""
    sweep_temperature: list[float] = field(default_factory=lambda: [0.5])
    """S9.3: other temperatures"""
    sweep_top_p: list[float] = field(default_factory=lambda: [0.8])
    """S9.3: other top-p"""
    sft_steps: int = 100
    """SFT steps on the kept samples"""
    sft_batch: int = 64
    """samples per SFT step"""
    lr: float = 1e-3
    """SFT learning rate"""
    weak_fraction: float = 0.25
    """S9.4: the weaker calculator's cold-start steps and problems, as a share of chapter 13's"""

    def __post_init__(self) -> None:
        if min(self.tasks, self.n, self.sft_steps, self.sft_batch, *self.sweep_n, 1) < 1:
            raise ValueError("rlhf_book rs: tasks, n, sweep_n, sft_steps and sft_batch must be >= 1")
        if not all(t > 0 for t in [self.temperature, *self.sweep_temperature]):
            raise ValueError("rlhf_book rs: temperatures must be > 0")
        if not all(0 < p <= 1 for p in [self.top_p, *self.sweep_top_p]) or not 0 < self.weak_fraction <= 1 \
                or not self.lr > 0:
            raise ValueError("rlhf_book rs: top_p and weak_fraction must be in (0, 1], lr > 0")

    def settings(self) -> dict[str, dict]:
        """stage suffix -> generation setting (n, temperature, top_p); "main" first."""
        main = {"n": self.n, "temperature": self.temperature, "top_p": self.top_p}
        out = {"main": main}
        out.update({f"n{n}": {**main, "n": n} for n in self.sweep_n})
        out.update({f"t{t:g}": {**main, "temperature": t} for t in self.sweep_temperature})
        out.update({f"p{p:g}": {**main, "top_p": p} for p in self.sweep_top_p})
        return out


class RolloutCache:
    """Scored samples on disk, one JSON file per (policy weights, problems, generation and scoring settings):
    `get(key, make)` reads the entry when it exists, else calls `make()` once and writes it (S9.1).

    The key is a SHA-1 of the settings as JSON; the policy enters it as a hash of its weights file, so a retrained
    policy never reads another's samples."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @staticmethod
    def key(settings: dict) -> str:
        return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def path(self, settings: dict) -> Path:
        return self.root / f"{self.key(settings)}.json"

    def get(self, settings: dict, make) -> tuple[list[Trajectory], bool]:
        """(the trajectories, whether they came from the cache)."""
        path = self.path(settings)
        if path.exists():
            data = json.loads(path.read_text())
            return [Trajectory(**t) for t in data["trajectories"]], True
        trajs = make()
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(path, {"settings": settings, "trajectories": [dataclasses.asdict(t) for t in trajs]})
        return trajs, False


def weights_hash(model_dir: Path) -> str:
    return hashlib.sha1((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()[:16]


def cache_settings(run_dir: Path, policy: str, setting: dict, config, n_tasks: int) -> dict:
    return {"policy": policy, "weights": weights_hash(run_dir / policy / "model"), "tasks": n_tasks,
            "task_seed": derive(config.seed, 901), "sample_seed": derive(config.seed, 902), "scorer": "exact_match",
            **setting}


def rollouts(ctx, policy: str, setting: dict, n_tasks: int) -> tuple[list[Trajectory], bool, dict]:
    """The policy's scored samples for `setting`, from the cache or generated now (then cached)."""
    config = ctx.config
    settings = cache_settings(ctx.run_dir, policy, setting, config, n_tasks)

    def make() -> list[Trajectory]:
        model, tok = load_model(ctx.run_dir / policy / "model")
        engine = ctx.engine(model)
        tasks = train_tasks(n_tasks, seed=settings["task_seed"])
        source = source_for(engine, Renderer(tok),
                            answer_sampling(temperature=setting["temperature"], top_p=setting["top_p"]))
        return sample_episodes(source, tasks, setting["n"], settings["sample_seed"])

    trajs, hit = RolloutCache(ctx.run_dir / "rs_cache" / "rollouts").get(settings, make)
    return trajs, hit, settings


def stage_cache(ctx) -> dict:
    """S9.1: build every generation setting's entry once (timed), then read the main one back (timed)."""
    d, built = ctx.config.rs, {}
    for name, setting in d.settings().items():
        t0 = time.perf_counter()
        trajs, hit, settings = rollouts(ctx, "coldstart", setting, d.tasks)
        built[name] = {"key": RolloutCache.key(settings), "hit": hit, "seconds": time.perf_counter() - t0,
                     "samples": len(trajs), "correct": sum(t.reward >= 1 for t in trajs) / len(trajs)}
    t0 = time.perf_counter()
    _, hit, _ = rollouts(ctx, "coldstart", d.settings()["main"], d.tasks)
    return {"built": built, "reread": {"hit": hit, "seconds": time.perf_counter() - t0}}


def coverage(trajs: list[Trajectory]) -> float:
    """Share of prompts with at least one correct sample (what any selection can find)."""
    groups: dict[int, bool] = {}
    for t in trajs:
        groups[t.group] = groups.get(t.group, False) or t.reward >= 1
    return sum(groups.values()) / len(groups)


def stage_select(ctx, selection: str, setting_name: str, policy: str) -> dict:
    """Select from the cached samples, SFT the policy on the kept ones, evaluate on the held-out sums."""
    config, d = ctx.config, ctx.config.rs
    n_tasks = d.tasks if policy == "coldstart" else max(1, round(d.tasks * d.weak_fraction))
    trajs, hit, _ = rollouts(ctx, policy, d.settings()[setting_name], n_tasks)
    mode, control = SELECTIONS[selection]
    kept = select_episodes(trajs, mode, random_control=control, seed=derive(config.seed, 903),
                           top_k=n_tasks if mode == "top_overall" else 0)
    model, tok = load_model(ctx.run_dir / policy / "model")
    r = Renderer(tok)
    engine = ctx.engine(model, dataclasses.replace(config.calc_optim, lr=d.lr))
    before = math_eval(engine, r, config.pass_k, derive(config.seed, 904)) if selection == "top_per_prompt" else None
    sft = SFTConfig(steps=d.sft_steps, batch_size=d.sft_batch, seed=derive(config.seed, 905))
    history = train_sft(engine, kept, sft, tok.pad_id, ctx.run())
    out = {"selection": selection, "setting": d.settings()[setting_name], "policy": policy, "cache_hit": hit,
           "samples": len(trajs), "kept": len(kept), "kept_correct": sum(t.reward >= 1 for t in kept) / len(kept),
           "sampled_correct": sum(t.reward >= 1 for t in trajs) / len(trajs), "coverage": coverage(trajs),
           "loss": [h["train/loss"] for h in history][-1],
           "after": math_eval(engine, r, config.pass_k, derive(config.seed, 904))}
    if before is not None:
        out["before"] = before
    return out


def stage_weak(ctx) -> dict:
    """S9.4: a weaker calculator: the cold start's recipe with `weak_fraction` of its steps and problems."""
    config, d = ctx.config, ctx.config.rs
    tok = arithmetic_tokenizer()
    r = Renderer(tok)
    torch.manual_seed(derive(config.seed, 906))
    model = calc_model(config, tok)
    engine = ctx.engine(model, config.calc_optim)
    steps = max(1, round(config.coldstart.steps * d.weak_fraction))
    data = demos(r, train_tasks(steps * config.coldstart.batch_size, seed=config.seed))
    train_sft(engine, data, dataclasses.replace(config.coldstart, steps=steps), tok.pad_id, ctx.run())
    ctx.save_model(model, tok, "model", meta={"stage": ctx.name})
    return {"steps": steps, **math_eval(engine, r, config.pass_k, derive(config.seed, 904))}


def stages(config) -> list[Stage]:
    d = config.rs
    select = ("seed", "rs", "calc_optim", "pass_k")  # `Stage.reads` of stage_select
    out = [Stage("rs_cache", stage_cache, after=("coldstart",), reads=("seed", "rs"))]
    out += [Stage(f"rs_{s}", stage_select, after=("rs_cache",), args=(s, "main", "coldstart"), reads=select)
            for s in SELECTIONS]
    out += [Stage(f"rs_{name}", stage_select, after=("rs_cache",), args=("top_per_prompt", name, "coldstart"),
                  reads=select)
            for name in d.settings() if name != "main"]
    out += [Stage(f"rs_n{n}_random", stage_select, after=("rs_cache",),
                  args=("random_per_prompt", f"n{n}", "coldstart"), reads=select)
            for n in d.sweep_n]  # S9.3's other side: a scorer that cannot separate (a random pick)
    out += [Stage("rs_weak", stage_weak,
                  reads=("seed", "rs", "coldstart", "calc_optim", "calc_dim", "calc_layers", "n_heads", "pass_k")),
            Stage("rs_weak_top", stage_select, after=("rs_weak",), args=("top_per_prompt", "main", "rs_weak"),
                  reads=select),
            Stage("rs_weak_random", stage_select, after=("rs_weak",), args=("random_per_prompt", "main", "rs_weak"),
                  reads=select)]
    return out


def acc(r: dict) -> float:
    """What a run is judged by: greedy accuracy on the 256 held-out sums."""
    return r["after"]["greedy"]


def versus(a: dict, b: dict, what: str) -> Estimate:
    """a's held-out greedy accuracy minus b's, paired over the 256 held-out sums (both policies answer the same
    problems: a problem both get right or both wrong adds no noise)."""
    return paired(b["after"]["per_problem"]["greedy"], a["after"]["per_problem"]["greedy"],
                  f"{what}, paired over {len(a['after']['per_problem']['greedy'])}")


def kept_share(r: dict) -> tuple[float, int]:
    """(hits, n): the kept samples that are correct."""
    return r["kept_correct"] * r["kept"], r["kept"]


def claims(results: dict, config) -> list[Claim]:
    d, out = config.rs, []
    cache = results.get("rs_cache")
    sel = {s: results.get(f"rs_{s}") for s in SELECTIONS}
    if cache and all(sel.values()):
        built = list(cache["built"].values())
        keys = {v["key"] for v in built}
        readers = [r for k, r in results.items() if k.startswith("rs_") and isinstance(r, dict) and "cache_hit" in r
                   and r["policy"] == "coldstart"]
        ok = cache["reread"]["hit"] and all(r["cache_hit"] for r in readers) and len(keys) == len(built)
        gen = sum(v["seconds"] for v in built)
        out.append(Claim("S9.1", "a reusable rollout cache", cite(9),
                         f"{len(built)} settings -> {len(keys)} entries, built in {gen:.1f} s; the main entry "
                         "re-read in "
                         f"{cache['reread']['seconds']:.2f} s; {sum(r['cache_hit'] for r in readers)} of "
                         f"{len(readers)} "
                         "selection runs read the cache",
                         '"Build the rollout cache once ... Later configs reuse it if generation and scoring settings '
                         'are unchanged": every selection run reads its entry without generating, and each distinct '
                         "setting has its own entry (counts, no noise)", ok))
    for cid, top, rnd in (("S9.2a", "top_per_prompt", "random_per_prompt"),
                          ("S9.2b", "top_k_overall", "random_k_overall")):
        a, b = sel[top], sel[rnd]
        if a and b:
            out.append(Claim.compare(cid, f"{top} vs {rnd}", cite(9),
                                     f"held-out greedy {fmt(acc(a))} vs {fmt(acc(b))} (pass@1 "
                                     f"{fmt(a['after']['pass_at']['1'])} vs {fmt(b['after']['pass_at']['1'])}); kept "
                                     f"correct {fmt(a['kept_correct'])} vs {fmt(b['kept_correct'])}, {a['kept']} "
                                     "samples each",
                                     '"the RM-selected run must beat its random control" (S9.2): higher held-out '
                                     "greedy accuracy", versus(a, b, "held-out greedy")))
    ns = [(s["n"], results.get("rs_top_per_prompt" if name == "main" else f"rs_{name}"))
          for name, s in d.settings().items() if name == "main" or name.startswith("n")]
    ns = sorted((n, r) for n, r in ns if r)
    if len(ns) > 1:
        parts = [Part(f"kept correct N {n0} -> {n1}", two_shares(*kept_share(r1), *kept_share(r0),
                                                                 f"kept correct, N {n1} - N {n0}, binomial"))
                 for (n0, r0), (n1, r1) in zip(ns, ns[1:])]
        parts.append(Part(f"held-out N {ns[-1][0]} - N {ns[0][0]}",
                          versus(ns[-1][1], ns[0][1], f"held-out greedy, N {ns[-1][0]} - N {ns[0][0]}")))
        holds, est, why = decide(parts)
        out.append(Claim("S9.3a", "more completions, a scorer that separates", cite(9),
                         "N: " + ", ".join(f"{n}: kept correct {fmt(r['kept_correct'])}, held-out {fmt(acc(r))}"
                                           for n, r in ns),
                         '"More completions help only if the RM can separate good from bad": with the verifier '
                         "(which separates), the kept set's correct share rises with N and held-out greedy accuracy at "
                         "the largest N beats the smallest", holds, est, why=why))
    rnd = sorted((n, results.get(f"rs_n{n}_random") or (sel["random_per_prompt"] if n == d.n else None))
                 for n in {d.n, *d.sweep_n})
    if len(ns) > 1 and all(r for _, r in rnd):
        (_, t0), (_, t1), (_, r0), (_, r1) = ns[0], ns[-1], rnd[0], rnd[-1]
        g_top, g_rnd = acc(t1) - acc(t0), acc(r1) - acc(r0)
        def gain(lo: dict, hi: dict) -> list[int]:  # per held-out problem: greedy right at the larger N - the smaller
            return [b - a for a, b in zip(lo["after"]["per_problem"]["greedy"], hi["after"]["per_problem"]["greedy"])]

        est = paired(gain(r0, r1), gain(t0, t1), "gain difference, paired over 256")
        out.append(Claim.compare("S9.3b", "more completions, a scorer that cannot separate", cite(9),
                                 f"held-out gain from N {ns[0][0]} to N {ns[-1][0]}: verifier's pick {fmt(g_top)}, "
                                 "random "
                                 f"pick {fmt(g_rnd)} (random pick's kept correct: "
                                 + ", ".join(f"N {n} {fmt(r['kept_correct'])}" for n, r in rnd) + ")",
                                 '"More completions help only if the RM can separate good from bad": a random pick (a '
                                 "scorer that cannot separate) gains less from more completions than the verifier's "
                                 "pick",
                                 est))
    weak, wt, wr = results.get("rs_weak"), results.get("rs_weak_top"), results.get("rs_weak_random")
    strong = sel["top_per_prompt"]
    if weak and wt and wr and strong:
        out.append(Claim.compare("S9.4", "the matched pair from a weaker policy", cite(9),
                                 f"weak calculator greedy {fmt(weak['greedy'])} (cold start "
                                 f"{fmt(strong['before']['greedy'])}); prompts with a correct sample: weak "
                                 f"{fmt(wt['coverage'])}, cold start {fmt(strong['coverage'])}; weak top "
                                 f"{fmt(acc(wt))} "
                                 f"vs random {fmt(acc(wr))} (gain {fmt(acc(wt) - weak['greedy'])} over the weak start; "
                                 f"cold start's gain {fmt(acc(strong) - strong['before']['greedy'])})",
                                 '"rerun the matched pairs. Does RS rescue weak generations, or merely select among '
                                 'already-good ones?": the pair\'s rule (top beats random) on the weaker policy; the '
                                 "coverage bounds what selection can find",
                                 versus(wt, wr, "held-out greedy")))
    return out


def section(run_dir: Path, results: dict, config) -> str:
    d = config.rs
    parts = ["## Ch.9 Rejection sampling (S9.1-S9.4)",
             f"The chapter-13 calculator samples {d.tasks} training sums x N; the verifier scores them; one round of "
             f"SFT ({d.sft_steps} steps of {d.sft_batch}) from the cold start on the kept samples; judged by greedy "
             "accuracy on the 256 held-out sums."]
    cache = results.get("rs_cache")
    if cache:
        parts.append("**S9.1** the rollout cache (`run_dir/rs_cache/rollouts/<key>.json`):\n\n" + markdown_table(
            ["setting", "key", "samples", "correct", "built (s)"],
            [[k, v["key"], v["samples"], fmt(v["correct"]), fmt(v["seconds"], 1)] for k, v in cache["built"].items()]))
    runs = {k: r for k, r in results.items() if k.startswith("rs_") and isinstance(r, dict) and "after" in r}
    if runs:
        bars = {k[3:]: acc(r) for k, r in runs.items()}
        first = next((r for r in runs.values() if "before" in r), None)
        if first:
            bars = {"cold start": first["before"]["greedy"], **bars}
        bar_plot(run_dir / "book-s9-rs.png", bars, "S9: held-out greedy accuracy after RS", "accuracy",
                 xlabel="run (rejection-sampling setting)")
        parts.append("**S9.2-S9.4** every run:\n\n" + markdown_table(
            ["run", "policy", "N", "T", "top-p", "kept", "kept correct", "coverage", "held-out greedy",
             "held-out pass@1", f"held-out pass@{config.pass_k}"],
            [[k, r["policy"], r["setting"]["n"], r["setting"]["temperature"], r["setting"]["top_p"], r["kept"],
              fmt(r["kept_correct"]), fmt(r["coverage"]), fmt(acc(r)), fmt(r["after"]["pass_at"]["1"]),
              fmt(r["after"]["pass_at"].get(str(config.pass_k), float("nan")))] for k, r in runs.items()])
            + "\n\n" + image(run_dir / "book-s9-rs.png", "RS held-out accuracy"))
    return "\n\n".join(parts)
