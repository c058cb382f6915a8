"""Metrics: one flat JSON line per logged step, namespaced keys, each documented once.

Every run writes `metrics.jsonl` into its run directory. A line looks like

    {"step": 10, "time": 3.2, "stage": "sft", "train/loss": 1.93, "eval/pass_rate": 0.4}

Keys are `namespace/name`. `METRICS` below is the glossary: every key any loop
logs is documented here (a test checks it), so a reader of a metrics file
never has to guess what a number means.

Where rows go besides the file, one small interface (`Tracker`: `log(step, metrics, stage)`,
`close()`), fed by `MetricsLogger.log`:

    TensorBoardTracker   run_dir/tb (torch.utils.tensorboard; `pip install 'trajtune[tensorboard]'`)
    WandbTracker         Weights & Biases, offline unless WANDB_MODE says otherwise (`pip install wandb`)

`make_tracker(name, run_dir)` builds one by name (`TRACKERS`); `check_tracker(name)` says before
a run starts what is missing. `Console` is what a person watching sees: a line every N steps
(loss, reward or accuracy, KL, lr, tokens/s, ETA) when stdout is a file or a pipe (nohup, SLURM,
containers), a progress bar with the same values on a terminal; `loop.Run` feeds it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import IO, Iterable, Protocol

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: one process per run directory
    fcntl = None

from tqdm.auto import tqdm

from .config import ConfigError

METRICS: dict[str, str] = {
    # --- train: one optimizer step (loops)
    "train/loss": "loss minimised at this step (after aggregation)",
    "train/grad_norm": "global gradient norm before clipping",
    "train/lr": "learning rate used for this step",
    "train/tokens": "number of trained-on (POLICY) tokens in the step's batch",
    "train/skipped": "1 if this step's gradient was NaN/Inf and the update was skipped (weights unchanged); RFT: the "
                     "round's count",
    "train/kept_episodes": "episodes the RL step trained on (after dropping zero-variance groups)",
    "train/round": "expert-iteration / iw-SFT round (1-based)",
    # --- eval: measured without gradient
    "eval/accuracy": "exact-match accuracy of greedy answers",
    "eval/loss": "mean NLL per trained-on token on evaluation data",
    "alarm/eval_drop": "with Run(eval_alarm=...): the largest drop, in points, of a watched static evaluation below "
                       "its first (0: none past the threshold; book App. C bad-job detection)",
    "eval/pass_rate": "share of evaluation episodes with reward >= 1",
    "eval/heldout_pass_rate": "share of held-out-task evaluation episodes with reward >= 1 (agent experiment)",
    "eval/invalid_per_episode": "mean invalid environment calls per evaluation episode (train tasks)",
    "eval/read_share": "share of evaluation episodes (train tasks) that read the source at least once",
    "eval/public_pass_rate": "share of evaluation episodes whose submit passes the public tests (A13's filter)",
    "eval/hidden_pass_rate": "share of evaluation episodes that submitted and pass the hidden tests (A13)",
    "eval/pair_accuracy": "share of held-out preference pairs the reward model orders correctly",
    "eval/reward": "mean reward of the held-out evaluation episodes (evaluation.score_policy)",
    "eval/pass@*": "pass@k of the held-out evaluation: the unbiased estimate over its n samples per task "
                   "(evaluation.score_policy)",
    "eval/env_errors": "held-out evaluation episodes whose environment failed (left out of the scores; "
                       "evaluation.score_policy)",
    # --- rollout: statistics of the step's sampled episodes (algorithms.common.rollout_metrics)
    "rollout/pass_rate": "share of sampled episodes with reward >= 1",
    "rollout/reward": "mean reward of sampled episodes",
    "rollout/policy_tokens": "mean number of POLICY tokens per sampled episode",
    "rollout/invalid_per_episode": "mean invalid environment calls per sampled episode",
    "rollout/truncated_share": "share of sampled episodes with a turn cut at the token budget (max new tokens) "
                               "before it ended (`Trajectory.truncated`)",
    "rollout/no_signal_share": "share of the step's groups whose rewards are all equal (no signal for a group "
                               "baseline)",
    "rollout/infra_failures": "episodes of the step whose environment or reward call failed (`trajectory.Outcome`): "
                              "left out of the loss and of their group's baseline; reward and pass rate are over the "
                              "others",
    # --- time: wall seconds of the step's sources (added up per stage: results.json "time")
    "time/sampling_s": "wall seconds the step's episodes took (sampling and environments; drawn ahead: in the "
                       "background)",
    "time/reward_s": "wall seconds the step's reward functions and reward models took",
    # --- cost: what an experiment counts per draw (a `Measured` source)
    "cost/sampled": "episodes sampled in the step (the agent experiment's cost table)",
    "cost/verifier_calls": "verifier calls (submits) in the step's episodes (the agent experiment's cost table)",
    # --- sft (objectives.sft)
    "sft/nll": "unweighted mean NLL per POLICY token",
    "sft/weight_mean": "mean trajectory weight w_i (1 for plain SFT)",
    "sft/tokens": "POLICY tokens in the batch",
    # --- pg: policy-gradient loss (objectives.policy_gradient)
    "pg/loss": "policy-gradient part of the loss (no KL, no entropy)",
    "pg/advantage_mean": "mean advantage over POLICY tokens",
    "pg/ratio_mean": "mean importance ratio pi / pi_old",
    "pg/ratio_max": "largest importance ratio in the batch",
    "pg/approx_kl": "0.5 * mean (log pi - log pi_old)^2: how far the update moved from the sampler",
    "pg/clip_frac": "share of POLICY tokens whose ratio was clipped",
    "pg/tis_weight_mean": "mean truncated importance-sampling weight against the sampler (correction tis, tis_seq)",
    "pg/tis_capped_frac": "share of tokens whose TIS weight hit the cap",
    "pg/correction_masked_frac": "share of POLICY tokens the mismatch correction masked (weight 0: mis_*, icepop, "
                                 "decoupled; objectives.corrections)",
    "pg/correction_seq_frac": "share of episodes with at least one token the correction masked or clipped",
    "pg/correction_weight_mean": "mean correction weight over POLICY tokens (icepop's in-band ratio, decoupled "
                                 "PPO's behaviour weight pi_old / pi_sampler; 0 where masked)",
    "pg/correction_fresh_frac": "share of the tokens sampled by the current weights (staleness 0) the correction "
                                "masked or clipped (given per-token staleness)",
    "pg/correction_stale_frac": "share of the tokens sampled 1 or more updates behind that the correction masked or "
                                "clipped (given per-token staleness)",
    "sync/logprob_diff": "max |sampler - trainer| log-prob of the same tokens after a weight sync, in the row of the "
                         "step whose update waited for it (sources.process)",
    "policy/entropy": "mean entropy (nats) of the policy at POLICY tokens",
    # --- value head (PPO)
    "value/loss": "value-regression loss 0.5 (V - return)^2",
    "value/clip_frac": "share of tokens where value clipping was active",
    "value/explained_variance": "1 - Var(return - V) / Var(return)",
    # --- kl: KL(pi || ref) estimates per POLICY token (objectives.kl)
    "kl/k1": "k1 estimate log(pi/ref): unbiased, high variance",
    "kl/k2": "k2 estimate 0.5 log(pi/ref)^2: biased, low variance",
    "kl/k3": "k3 estimate ref/pi - 1 - log(ref/pi): unbiased, low variance",
    # --- the RL loop's (algorithms.rl)
    "kl/sequence": "KL(pi || ref) per episode: the per-token estimate (kl/<estimator>) summed over the episode's "
                   "POLICY tokens, mean over episodes (logged whenever a reference exists, kl_coef 0 included)",
    "kl/coef": "the KL coefficient the step trained with: the adaptive controller's current value (kl_target)",
    "kl/controller_kl": "the mean sequence KL (k1 summed over an episode, pi_old against the reference) the "
                        "adaptive KL controller moved kl/coef with (kl_target)",
    "kl/teacher": "on-policy distillation (opd_coef): KL(pi || teacher), the k1 estimate per POLICY token of "
                  "the step's episodes (minus the mean teacher log-ratio that opd_coef weights into the advantages)",
    "rollout/baseline": "advantage='moving_average': the moving-average baseline the step's rewards were compared "
                        "with",
    "rollout/overlong_penalty": "mean of DAPO's overlong soft penalty added to the step's rewards (overlong_max)",
    "rollout/overlong_filtered": "episodes cut off by the token budget and left out of the loss (overlong_filter)",
    "train/ptx_loss": "PPO-ptx: the NLL of the step's last batch of pretraining text (ptx_coef)",
    # --- preference losses (objectives.preference)
    "dpo/chosen_reward": "beta (log pi - log ref) of chosen episodes",
    "dpo/rejected_reward": "beta (log pi - log ref) of rejected episodes",
    "dpo/margin": "chosen minus rejected implicit reward",
    "dpo/accuracy": "share of pairs with a positive margin",
    "dpo/chosen_logp_drift": "log pi - log ref of chosen episodes (nats)",
    "dpo/rejected_logp_drift": "log pi - log ref of rejected episodes (nats)",
    "dpo/nll": "NLL per chosen token (DPO + NLL)",
    "simpo/chosen_reward": "beta * mean log pi per token of chosen episodes",
    "simpo/rejected_reward": "beta * mean log pi per token of rejected episodes",
    "simpo/margin": "chosen minus rejected SimPO reward",
    "simpo/accuracy": "share of pairs with a positive SimPO margin",
    "orpo/accuracy": "share of pairs where chosen has the higher odds",
    "orpo/log_odds_ratio": "mean log odds ratio chosen vs rejected",
    "orpo/nll": "NLL part of the ORPO loss",
    "seqkd/demos": "SEQ-KD: teacher completions kept as demonstrations",
    "seqkd/dropped": "SEQ-KD: teacher completions dropped (a failed episode, or reward below min_reward)",
    "seqkd/teacher_reward": "SEQ-KD: mean reward of the teacher's completions that worked",
    "rebel/margin": "REBEL: beta (= 1/eta) times the chosen-minus-rejected log-ratio, batch mean",
    "rebel/target": "REBEL: the pairs' score difference the margin is regressed onto, batch mean",
    "rebel/accuracy": "REBEL: share of pairs whose margin has the sign of their score difference",
    "slic/margin": "SLiC-HF: log pi(chosen) - log pi(rejected), batch mean",
    "slic/active": "SLiC-HF: share of pairs inside the hinge's margin (the only ones with a gradient)",
    "slic/nll": "SLiC-HF: the chosen replies' NLL (its regulariser, nll_weight > 0)",
    "apo/chosen_reward": "APO: beta (log pi - log ref) of the chosen replies, batch mean",
    "apo/rejected_reward": "APO: beta (log pi - log ref) of the rejected replies, batch mean",
    "apo/margin": "APO: chosen minus rejected reward, batch mean",
    "apo/accuracy": "APO: share of pairs whose chosen reward is above the rejected one",
    "kto/desirable_reward": "mean implicit reward of desirable episodes",
    "kto/undesirable_reward": "mean implicit reward of undesirable episodes",
    "kto/z0": "KTO reference point (batch KL estimate)",
    # --- reward models (objectives.reward_model)
    "rm/accuracy": "share of pairs the reward model orders correctly",
    "rm/margin": "mean r_chosen - r_rejected",
    "rm/chosen": "mean reward of chosen episodes",
    "rm/rejected": "mean reward of rejected episodes",
    "rm/top1_accuracy": "share of K-wise rankings whose best item scores highest",
    "orm/accuracy": "per-token accuracy of the outcome reward model",
    "orm/tokens": "tokens the ORM was trained on",
    "prm/accuracy": "per-step accuracy of the process reward model",
    "prm/steps": "labelled steps in the batch",
    # --- iw-SFT weights (objectives.importance)
    "iw/weight_mean": "mean trajectory importance weight",
    "iw/weight_max": "largest trajectory importance weight",
    "iw/log_weight_mean": "mean log weight",
    "iw/ess": "effective sample size / batch size, (sum w)^2 / (B sum w^2)",
    # --- rejection sampling (algorithms.rft)
    "rft/sampled": "episodes sampled this round",
    "rft/kept_raw": "episodes the selection kept, before dedup and cap",
    "rft/kept": "episodes trained on this round",
    "rft/kept_hack_share": "share of kept episodes passing public tests but failing hidden ones",
    "rft/share_*": "share of kept episodes per value of the config's share_key (e.g. task family)",
    # --- distillation (objectives.distill)
    "distill/reverse_kl": "exact KL(student || teacher) per POLICY token",
    # --- time
    "time/step_s": "wall seconds of this step",
}


def is_documented(key: str) -> bool:
    """True for keys in `METRICS` (an entry ending in '_*' documents a family, e.g. rft/share_*)."""
    if key in METRICS:
        return True
    return any(k.endswith("*") and key.startswith(k[:-1]) for k in METRICS)


def register(key: str, doc: str) -> None:
    """Document a metric key from an extension (algorithms register theirs at import)."""
    if "/" not in key:
        raise ValueError(f"metric key {key!r} must be namespaced, like 'train/{key}'")
    METRICS.setdefault(key, doc)


class MetricsLogger:
    """Append-only `metrics.jsonl` writer; every row also goes to its `trackers` (TensorBoard, W&B).

    Several processes may log to one run directory (an experiment's parallel stages):
    every write holds a lock (`.metrics.lock`, POSIX) and reopens the file if another
    process replaced it (`drop_after`), so no row is lost or written to a stale file.
    """

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = False, strict: bool = False,
                 trackers: Iterable[Tracker] = ()):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock_fh = open(self.run_dir / ".metrics.lock", "a")
        self._t0 = time.time()
        self.strict = strict
        self.trackers: list[Tracker] = list(trackers)
        """where every row goes besides the file (`add` more)"""
        if tensorboard:
            self.add(make_tracker("tensorboard", self.run_dir))

    def add(self, tracker: Tracker) -> Tracker:
        """Send every later row to `tracker` too (closed with this logger)."""
        self.trackers.append(tracker)
        return tracker

    def log(self, step: int, metrics: dict[str, float], stage: str | None = None) -> None:
        row: dict = {"step": int(step), "time": round(time.time() - self._t0, 3)}
        if stage is not None:
            row["stage"] = stage
        values = {}
        for k, v in metrics.items():
            if "/" not in k:
                raise ValueError(f"metric key {k!r} is not namespaced (e.g. 'train/{k}')")
            if self.strict and not is_documented(k):
                raise KeyError(f"metric key {k!r} is not documented in trajtune.metrics.METRICS")
            values[k] = v = float(v)
            row[k] = v if math.isfinite(v) else str(v)
        with self._locked():
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        for t in self.trackers:
            t.log(int(step), values, stage)

    @contextlib.contextmanager
    def _locked(self):
        """Hold the run directory's metrics lock; reopen our handle if the file was replaced."""
        if fcntl is not None:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_EX)
        try:
            try:
                replaced = os.fstat(self._fh.fileno()).st_ino != os.stat(self.path).st_ino
            except FileNotFoundError:
                replaced = True
            if replaced:
                self._fh.close()
                self._fh = open(self.path, "a", encoding="utf-8")
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)

    def drop_after(self, stage: str, step: int) -> int:
        """Remove rows of `stage` logged after `step` (a resumed run logs them again; -1: all its rows);
        returns how many were removed."""
        with self._locked():
            rows = read_metrics(self.path)
            kept = [r for r in rows if not (r.get("stage") == stage and r.get("step", 0) > step)]
            if len(kept) == len(rows):
                return 0
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in kept))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self._fh.close()
            self._fh = open(self.path, "a", encoding="utf-8")
            return len(rows) - len(kept)

    def close(self) -> None:
        self._fh.close()
        self._lock_fh.close()
        for t in self.trackers:
            t.close()
        self.trackers = []

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def combine_metric(into: dict[str, float], key: str, value: float, share: float = 1.0) -> None:
    """Add one part's metric to the whole batch's: extrema (keys ending in `_max` / `_min`, e.g.
    pg/ratio_max) by max / min, everything else as a share-weighted sum (a mean over the whole batch)."""
    if key.endswith("_max"):
        into[key] = max(into.get(key, -math.inf), value)
    elif key.endswith("_min"):
        into[key] = min(into.get(key, math.inf), value)
    else:
        into[key] = into.get(key, 0.0) + share * value


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Rows of a `metrics.jsonl` file (a run directory or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str = "", disable: bool | None = None):
    """A tqdm progress bar with ETA (hidden when stderr is not a terminal unless forced)."""
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False)


# --- trackers: where rows go besides metrics.jsonl ---------------------------------------------
class Tracker(Protocol):
    """A sink for metric rows (TensorBoard, W&B, your own): `MetricsLogger.add(tracker)`."""

    def log(self, step: int, metrics: dict[str, float], stage: str | None) -> None: ...

    def close(self) -> None: ...


TRACKERS = {"tensorboard": ("torch.utils.tensorboard", "pip install 'trajtune[tensorboard]'"),
            "wandb": ("wandb", "pip install wandb")}
"""name -> (the module it imports, how to install it)"""


def check_tracker(name: str) -> None:
    """Before a run starts: a ConfigError naming the install command if tracker `name` cannot load."""
    import importlib

    if name not in TRACKERS:
        raise ConfigError(f"--report-to {name!r}: choose from {', '.join(TRACKERS)}")
    module, install = TRACKERS[name]
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--report-to {name} needs a package that is not installed ({e}); {install}") from None


def make_tracker(name: str, run_dir: str | os.PathLike, config: dict | None = None) -> Tracker:
    """The tracker called `name` ("tensorboard": run_dir/tb; "wandb": offline in run_dir/wandb)."""
    check_tracker(name)
    return TensorBoardTracker(run_dir) if name == "tensorboard" else WandbTracker(run_dir, config)


class TensorBoardTracker:
    """Scalars to run_dir/tb, tagged `<stage>/<key>` (`tensorboard --logdir run_dir/tb`)."""

    def __init__(self, run_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"))

    def log(self, step: int, metrics: dict[str, float], stage: str | None) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k if stage is None else f"{stage}/{k}", v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in run_dir/wandb: offline (no network, `wandb sync` uploads it later)
    unless the user set WANDB_MODE; the project is $WANDB_PROJECT or "trajtune"."""

    def __init__(self, run_dir: str | os.PathLike, config: dict | None = None):
        os.environ.setdefault("WANDB_MODE", "offline")
        import wandb

        run_dir = Path(run_dir)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "trajtune"), name=run_dir.name,
                              dir=str(run_dir), config=config or {})

    def log(self, step: int, metrics: dict[str, float], stage: str | None) -> None:
        self.run.log({k if stage is None else f"{stage}/{k}": v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


# --- the console: what a person watching a run sees ----------------------------------------------
SHOWN = (("loss", ("train/loss",)), ("reward", ("rollout/reward",)),
         ("acc", ("dpo/accuracy", "rm/accuracy", "simpo/accuracy", "orpo/accuracy")), ("kl", ("kl/k3", "kl/k1")),
         ("lr", ("train/lr",)))
"""(label, keys): a console line shows the first of `keys` a row has"""


class Console:
    """Training progress for a person: every `every`-th step (and the last, and every evaluation)
    a line `sft  step 10/100  loss 1.2345  kl 0.0123  lr 1.0e-05  812 tok/s  eta 1m05s` when `stream`
    (stdout) is not a terminal; on a terminal a tqdm bar with those values instead.

    `start(step, total)` when the loop starts (a resume starts at its step), `update(step, row)`
    after each logged row (`loop.Run` calls both). Rows may skip steps (RFT logs once per round)."""

    def __init__(self, stage: str, every: int = 10, total: int | None = None, stream: IO | None = None,
                 bar: bool | None = None):
        self.stage, self.every, self.total = stage, max(int(every), 1), total
        self.stream = stream or sys.stdout
        self.bar = _isatty(self.stream) if bar is None else bar
        self._tqdm = None
        self._begin, self._shown, self._tokens, self._t0 = 0, 0, 0.0, time.perf_counter()

    def start(self, step: int, total: int | None = None) -> None:
        self.total = self.total or total
        self._begin = self._shown = step
        self._tokens, self._t0 = 0.0, time.perf_counter()

    def update(self, step: int, row: dict) -> None:
        self._tokens += float(row.get("train/tokens", 0.0))
        evals = {k: v for k, v in row.items() if k.startswith("eval/")}
        if self.bar and self._tqdm is None:
            self._tqdm = tqdm(total=self.total, initial=self._begin, desc=self.stage, file=self.stream,
                              dynamic_ncols=True, leave=True)
        if self._tqdm is not None:
            self._tqdm.update(max(step - self._tqdm.n, 0))
            self._tqdm.set_postfix_str(self.values(step, row), refresh=True)
            if evals:
                self._tqdm.write(f"{self.stage}  step {step}  " + _pairs(evals))
            if self.total and step >= self.total:
                self._tqdm.close()
            return
        last = bool(self.total) and step >= self.total
        if evals or last or step // self.every > self._shown // self.every:
            self._shown = step
            where = f"{step}/{self.total}" if self.total else str(step)
            text = f"{self.stage}  step {where}  {self.values(step, row)}" + (f"  {_pairs(evals)}" if evals else "")
            print(text, file=self.stream, flush=True)

    def values(self, step: int, row: dict) -> str:
        """'loss 1.2345  kl 0.0123  lr 1.0e-05  812 tok/s  eta 1m05s' for `row` at `step`."""
        parts = []
        for label, keys in SHOWN:
            key = next((k for k in keys if k in row), None)
            if key is not None:
                v = float(row[key])
                parts.append(f"{label} {v:.1e}" if label == "lr" else f"{label} {v:.4g}")
        if row.get("train/skipped"):
            parts.append("SKIPPED (non-finite)")
        elapsed, done = time.perf_counter() - self._t0, step - self._begin
        if done > 0 and elapsed > 0:
            parts.append(speed(self._tokens, elapsed, done))
            if self.total and self.total > step:
                parts.append(f"eta {_duration(elapsed / done * (self.total - step))}")
        return "  ".join(parts)


def speed(tokens: float, seconds: float, steps: int) -> str:
    """The console's pace: trained tokens per second, to two significant digits below 10 ('812 tok/s', '3.4 tok/s',
    '0.41 tok/s': a few tokens a step on a slow model is not '0 tok/s'); seconds per step where the rows count no
    tokens ('1.23 s/step', '45 ms/step')."""
    if tokens:
        rate = tokens / seconds
        return f"{rate:,.0f} tok/s" if rate >= 10 else f"{rate:.2g} tok/s"
    per_step = seconds / steps
    return f"{per_step:.3g} s/step" if per_step >= 0.1 else f"{1000 * per_step:.2g} ms/step"


def _pairs(values: dict) -> str:
    return "  ".join(f"{k} {float(v):.4g}" for k, v in values.items())


def _duration(seconds: float) -> str:
    """'45s', '3m05s', '2h07m'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
