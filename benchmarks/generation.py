"""Generation throughput: trajtune's sampler, HF generate, vLLM colocated and vLLM server; and one GRPO step with each.

    python benchmarks/generation.py                                  # every size and shape, every backend
    python benchmarks/generation.py --sizes small --shapes 8x16 --repeats 1 --grpo-shape 2x4x8   # a smoke run
    python benchmarks/generation.py --threads 1 --clock cpu          # on a busy machine: CPU seconds
    python benchmarks/generation.py --backends sampler generate vllm # no server column
    python benchmarks/generation.py --model smollm2-135m --shapes 64x64 8x256 --threads 1 --clock cpu  # a real model

Table 1, tokens/s (random Llamas built from a config, nothing downloaded; the same prompts, 8-24 random token
ids each, sampling at temperature 1, NO stop token: every row writes every token, so each backend writes
prompts x new tokens; the table prints each backend's count and the script stops if they differ):
  sampler   `TorchEngine.sample(backend="sampler", draw="cdf")` on `trajtune.models.hf.load_policy(dir)` (what
            `trajtune grpo` runs by default; fp32)
  generate  `TorchEngine.sample(backend="generate")`: HF `model.generate` + the behaviour log-probs (fp32)
  vllm      `trajtune.sources.vllm.VLLMSampler(Colocated(dir, dtype="float32"), settings)`.sample: vLLM's engine in
            this machine's memory (its engine core a child process; on a CPU vLLM's CPU build, enforce_eager)
  server    the same runner over `Servers([url])` of a `python -m trajtune vllm-serve --model DIR --port P`
            started by this script (waits for GET /health; the column says why when it cannot start)
Each cell is the fastest of --repeats calls (vLLM's prefix cache is reset between them; one untimed warm-up call
of 2 rows first for every backend). Ratios: vllm / sampler and server / sampler (> 1: vLLM faster). vLLM's CPU
build refuses head size 16 ("tiny": hidden 64, 4 heads): its cells then say so. Sizes: tiny (0.10M), small
(3.0M), flop (vs_trl.py's FLOP row: 20.5M, hidden 384, 6 layers, vocab 16,384), 100m (hidden 768, 12 layers,
MLP 2048, 12 heads, vocab 16,384: ~98M).

--model SPEC: a real model instead of the random sizes (one row per shape, named by SPEC): a Hugging Face folder,
or a name `trajtune.models.hub.resolve_model` resolves (`smollm2-135m`: `trajtune models fetch smollm2-135m` first);
its prompts are user questions in its own chat template (`apply_chat_template`, generation prompt added; 30-45
tokens with SmolLM2's default system turn), the same for every backend. Table 2 on it: --grpo-sizes model.
--vllm-memory: vLLM's --gpu-memory-utilization (on its CPU build the share of this machine's memory it takes for
weights and KV cache; default 0.3).

Every cell's line prints the 1-minute load average before and after it: a cell measured under load other
processes made is not the code's speed (compare within a row, and rerun on an idle machine).

--clock cpu: CPU seconds of this process AND its child processes (vLLM's engine core, the server; psutil,
recursive), so vLLM's work counts; with --threads 1 a cell is roughly what one core does.

Table 2, one GRPO step with each backend: `trajtune grpo` run in this process (`trajtune.cli.main`) on the
same model, --grpo-shape PxGxN (P prompts x G completions of N max new tokens; default 8x8x64),
--grpo-steps steps (default 3), reward: the completion's length in characters; --backend sampler / generate /
vllm (colocated: the run starts its own engine) / vllm --vllm-server URL. What is timed: the run's own
metrics.jsonl, median over the steps after the first (the first includes warm-up and, for vLLM, the first
weight sync) of the step's wall seconds (the interval between consecutive rows' "time" stamps: sampling, reward,
update, logging and, for vLLM, the weight sync) and of time/sampling_s; for vLLM also time/sync_s and
sync/logprob_diff; rollout/policy_tokens is the mean completion length. Engine start-up (vLLM's ~20 s) is not in any
step. GRPO rows stop at the end-of-turn token, so token counts differ by backend.

TRL's GRPO with `use_vllm=True` on a CPU (trl 1.16.0, /work/vllm-venv/lib/python3.11/site-packages/trl/):
  - server mode cannot sync weights without CUDA: `VLLMClient.init_communicator` (generation/vllm_client.py:756-760)
    raises NotImplementedError "Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a
    CUDA device" for any non-cuda device; GRPOTrainer calls it at construction (generation/vllm_generation.py:309),
    and the server must also run with `--weight-transfer-config '{"backend": "nccl"}'` (vllm_client.py:736-740).
  - colocate mode builds `vllm.LLM(..., distributed_executor_backend="external_launcher")`
    (generation/vllm_generation.py:346-362) and syncs by calling the model's `load_weights` directly
    (vllm_generation.py:509-511, `llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights`):
    no NCCL, but see benchmarks/README.md for what happened when it was tried on this CPU build. No TRL column.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

BACKENDS = ("sampler", "generate", "vllm", "server")
SIZES = ("tiny", "small", "flop", "100m")
VOCAB = 16_384
OVERRIDES = {
    "flop": ("tiny", dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
                          num_key_value_heads=6)),  # benchmarks/vs_trl.py FLOP_MODEL
    "100m": ("tiny", dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                          num_key_value_heads=12)),
}
CLOCK = time.perf_counter


def cpu_clock() -> float:
    """CPU seconds of this process and all its live descendants (vLLM's engine core, a server we started)."""
    import psutil

    t = time.process_time()
    for child in psutil.Process().children(recursive=True):
        try:
            c = child.cpu_times()
            t += c.user + c.system
        except psutil.Error:
            pass
    return t


def make_model(d: Path, size: str) -> Path:
    from trajtune.models.hf_random import make_random_model

    if size in OVERRIDES:
        base, over = OVERRIDES[size]
        return make_random_model(d / size, "llama", base, padded_vocab=VOCAB, overrides=over)
    return make_random_model(d / size, "llama", size)


def prompts_for(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    """n random prompts of 8-24 token ids (a random model: any ids are as good as text)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, min(vocab, 512), (int(k),), generator=g).tolist()
            for k in torch.randint(8, 25, (n,), generator=g)]


def chat_prompts(model_dir: Path):
    """-> prompts(n, seed): n user questions in the model's own chat template (a real model: text it reads)."""
    from trajtune.models.hf import load_tokenizer

    tok = load_tokenizer(model_dir)

    def prompts(n: int, seed: int = 0) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for a, b in torch.randint(2, 100, (n, 2), generator=g).tolist():
            ids = tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}? Explain each step."}],
                                          tokenize=True, add_generation_prompt=True)
            out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        return out

    return prompts


def resolve(spec: str) -> Path:
    """--model: `trajtune.models.hub.resolve_model(spec)` (a folder, a hub id, a .gguf file, a catalog name)."""
    from trajtune.models.hub import ModelPathError, resolve_model

    try:
        return Path(resolve_model(spec))
    except ModelPathError as e:
        sys.exit(f"generation.py: --model {spec}: {e}")


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def timed(fn, repeats: int, before=None):
    """(fastest seconds of `repeats` calls on CLOCK, the last result); before(): untimed, before each call."""
    best, out = float("inf"), None
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = CLOCK()
        out = fn()
        best = min(best, CLOCK() - t0)
    return best, out


def measure(sample, shapes, prompts_fn, repeats, reset=None) -> dict:
    """{shape: (tokens, tokens/s)} of `sample(prompts, n, generator)` on `prompts_fn(b, seed)`, one warm-up call
    first."""
    sample(prompts_fn(2, 99), 4, torch.Generator().manual_seed(0))
    out = {}
    for b, n in shapes:
        prompts = prompts_fn(b, 0)
        before = load()
        t, s = timed(lambda: sample(prompts, n, torch.Generator().manual_seed(1)), repeats, reset)
        toks = sum(len(x) for x in s.tokens)
        out[(b, n)] = (toks, toks / t)
        print(f"  {b}x{n}: {toks} tokens, {toks / t:,.0f} tok/s (load average {before} before, {load()} after)",
              flush=True)
    return out


def short(e: BaseException) -> str:
    s = " ".join(str(e).split())
    if "EngineDeadError" in type(e).__name__ or "EngineCore encountered" in s:
        return "vLLM's engine core died (its log above says why)"
    if "Unsupported CPU attention" in s or "head_dim" in s.lower() or "head size" in s.lower():
        return "refused: vLLM CPU attention does not support this head size"
    return f"{type(e).__name__}: {s[:160]}"


def vllm_refuses(model_dir: Path) -> str | None:
    """Why vLLM cannot run `model_dir` here, known before it starts (`trajtune.sources.vllm.check_model_runs`:
    its CPU build's head sizes), short for a table cell; None: it may."""
    from trajtune.config import ConfigError
    from trajtune.sources.vllm import check_model_runs

    try:
        check_model_runs(model_dir)
    except ConfigError as e:
        head = str(e).split("its head size is ")[-1].split()[0]
        return f"refused: vLLM's CPU attention has no head size {head}"
    return None


# --- the vLLM server ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m trajtune vllm-serve --model DIR --port P` in a session of its own; up when GET /health answers."""

    def __init__(self, model_dir: Path, log: Path, timeout: float = 300.0, memory: float = 0.3):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        cmd = [sys.executable, "-m", "trajtune", "vllm-serve", "--model", str(model_dir), "--port", str(self.port),
               # the trainer's fp32 (vLLM's "auto" would take a float32 checkpoint to 16 bits)
               "--dtype", "float32", "--gpu-memory-utilization", str(memory)]
        if not torch.cuda.is_available():
            cmd += ["--", "--enforce-eager"]  # as Colocated on a CPU: no torch.compile warm-up (minutes on 2 cores)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                self.close()
                lines = Path(log).read_text().strip().splitlines()
                errors = [x for x in lines if "Error" in x and "initialization failed" not in x]
                tail = (errors or lines or [""])[0].split("]")[-1].strip()
                raise RuntimeError(f"`{' '.join(cmd[1:4])}` exited with code {self.proc.returncode}: {tail[:200]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                self.close()
                raise RuntimeError(f"no answer on {self.url}/health within {timeout:.0f} s (log: {log})")
            time.sleep(1)
        self.start_s = time.monotonic() - t0

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)  # our own session: the server and the engine core it started
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


# --- table 1 ---------------------------------------------------------------------------------------------
def tokens_per_s(size: str, model_dir: Path, args, work: Path) -> dict:
    """{backend: {shape: (tokens, tok/s)} or a reason string}"""
    from trajtune.engine.torch_engine import make_engine
    from trajtune.models.hf import load_policy

    res: dict = {}
    policy = load_policy(model_dir).eval()
    vocab = policy.base_config.vocab_size
    prompts_fn = chat_prompts(model_dir) if args.model else (lambda n, seed: prompts_for(vocab, n, seed))
    engine = make_engine(policy)
    for backend in ("sampler", "generate"):
        if backend in args.backends:
            print(f"[{size}] {backend}", flush=True)
            kw = dict(draw="cdf") if backend == "sampler" else {}
            res[backend] = measure(lambda p, n, g: engine.sample(p, n, g, backend=backend, stop_ids=(), **kw),
                                   args.shapes, prompts_fn, args.repeats)
    engine = policy = None  # free them before vLLM starts
    refused = vllm_refuses(model_dir)  # checked before spending vLLM's start-up on it
    if refused:
        for b in ("vllm", "server"):
            if b in args.backends:
                res[b] = refused
                print(f"[{size}] {b}: {res[b]}", flush=True)
        return res
    if "vllm" in args.backends:
        print(f"[{size}] vllm colocated", flush=True)
        res["vllm"] = with_vllm(lambda: colocated(model_dir, args.vllm_memory), args, prompts_fn)
    if "server" in args.backends:
        print(f"[{size}] vllm server", flush=True)
        res["server"] = with_vllm(lambda: served(model_dir, work / f"server-{size}.log", args.vllm_memory), args,
                                  prompts_fn)
    return res


def colocated(model_dir: Path, memory: float):
    from trajtune.sources.vllm import Colocated

    client = Colocated(model_dir, dtype="float32", max_model_len=512, gpu_memory_utilization=memory)
    return client, (lambda: client.llm.reset_prefix_cache())


def served(model_dir: Path, log: Path, memory: float):
    from trajtune.sources.vllm import Servers

    server = Server(model_dir, log, memory=memory)
    print(f"  server up in {server.start_s:.0f} s at {server.url}", flush=True)
    try:
        client = Servers([server.url])
    except BaseException:
        server.close()
        raise
    client.log = log  # the server's output: its first error names why a cell failed
    close = client.close

    def close_both():
        try:
            close()
        finally:
            server.close()

    client.close = close_both
    return client, (lambda: client._call(server.url, "POST", "/reset_prefix_cache", None))


def with_vllm(start, args, prompts_fn):
    from trajtune.sources.sampler import SamplerSettings
    from trajtune.sources.vllm import VLLMSampler

    try:
        client, reset = start()
    except BaseException as e:  # noqa: BLE001  reported in the table
        if isinstance(e, KeyboardInterrupt):
            raise
        print(f"  skipped: {short(e)}", flush=True)
        return short(e)
    runner = VLLMSampler(client)
    try:
        return measure(lambda p, n, g: VLLMSampler(client, SamplerSettings(n)).sample(p, (), g), args.shapes,
                       prompts_fn, args.repeats, reset)
    except Exception as e:  # noqa: BLE001
        from trajtune.sources.vllm import first_error

        cause = first_error(client.log) if getattr(client, "log", None) else None
        print(f"  failed: {short(e)}" + (f"; its log's first error: {cause}" if cause else ""), flush=True)
        return short(e) if cause is None else f"{short(e)}: {cause[:160]}"
    finally:
        runner.close()


# --- table 2 -------------------------------------------------------------------------------------------------
def grpo_step(model_dir: Path, backend: str, args, work: Path, tag: str) -> dict | str:
    """One `trajtune grpo` run in this process -> the medians of its metrics after the first step."""
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    P, G, N = args.grpo_shape
    data, rewards = work / "prompts.jsonl", work / "rewards.py"
    if not data.exists():
        with open(data, "w") as f:
            for i in range(max(P, 8)):
                f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}]}) + "\n")
        rewards.write_text("def length(prompts, completions, **kw):\n"
                           "    return [float(len(c[-1]['content'])) for c in completions]\n")
    out = work / f"grpo-{tag}"
    argv = ["grpo", "--model", str(model_dir), "--data", str(data), "--reward", f"{rewards}:length",
            "--steps", str(args.grpo_steps), "--prompts-per-step", str(P), "--group-size", str(G),
            "--max-new-tokens", str(N), "--lr", "1e-5", "--out", str(out), "--overwrite",
            "--backend", "vllm" if backend in ("vllm", "server") else backend]
    if backend == "vllm":
        argv += ["--vllm-gpu-memory-utilization", str(args.vllm_memory)]
    if backend in ("vllm", "server") and (refused := vllm_refuses(model_dir)):
        return refused
    server = None
    try:
        if backend == "server":
            server = Server(model_dir, work / f"server-grpo-{tag}.log", memory=args.vllm_memory)
            argv += ["--vllm-server", server.url]
        code = main(argv)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return short(e)
    finally:
        if server is not None:
            server.close()
    if code != 0:
        return f"trajtune grpo exited {code} (its message is above)"
    every = read_metrics(out)
    rows = every[1:]
    if not rows:
        return "no step after the first"

    def med(key):
        xs = [r[key] for r in rows if key in r]
        return statistics.median(xs) if xs else None

    got = {k: med(k) for k in ("time/sampling_s", "time/sync_s", "sync/logprob_diff", "rollout/policy_tokens")}
    # a step: the interval between consecutive logged rows (their "time" stamps), after the first step
    got["step_s"] = statistics.median(b["time"] - a["time"] for a, b in zip(every, every[1:]))
    return got


# --- printing -------------------------------------------------------------------------------------------
def cell(v, fmt="{:,.0f}") -> str:
    return "-" if v is None else (v if isinstance(v, str) else fmt.format(v))


def print_tables(results: dict, grpo: dict, args, params: dict) -> None:
    print("\n## Tokens/s (prompts x new tokens, no stop token)\n")
    print("| size | params | shape | tokens (sampler/generate/vllm/server) | sampler tok/s | generate tok/s | "
          "vLLM colocated tok/s | vLLM server tok/s | generate / sampler | vllm / sampler | server / sampler |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, res in results.items():
        for shape in args.shapes:
            def get(b, i):
                r = res.get(b)
                if r is None:
                    return None
                return r if isinstance(r, str) else r[shape][i]

            toks = [get(b, 0) for b in BACKENDS]
            counts = "/".join("-" if t is None or isinstance(t, str) else str(t) for t in toks)
            nums = [t for t in toks if isinstance(t, int)]
            if len(set(nums)) > 1:
                counts += " MISMATCH"
            rate = {b: get(b, 1) for b in BACKENDS}
            own = rate["sampler"]

            def ratio(b):
                x = rate[b]
                return f"{x / own:.2f}x" if isinstance(x, float) and isinstance(own, float) else "-"

            print(f"| {args.model if size == 'model' else size} | {params[size] / 1e6:.2f}M | {shape[0]}x{shape[1]} | "
                  f"{counts} | "
                  + " | ".join(cell(rate[b]) for b in BACKENDS)
                  + f" | {ratio('generate')} | {ratio('vllm')} | {ratio('server')} |")
    if grpo:
        P, G, N = args.grpo_shape
        print(f"\n## One GRPO step ({P} prompts x {G} completions, <= {N} new tokens; median of steps "
              f"2..{args.grpo_steps})\n")
        print("| size | backend | step s | sampling s | sync s | policy tokens / episode | sync/logprob_diff |")
        print("|---|---|---|---|---|---|---|")
        for (size, backend), r in grpo.items():
            size = args.model if size == "model" else size
            if isinstance(r, str):
                print(f"| {size} | {backend} | {r} | | | | |")
            else:
                print(f"| {size} | {backend} | {cell(r['step_s'], '{:.2f}')} | "
                      f"{cell(r['time/sampling_s'], '{:.2f}')} | {cell(r['time/sync_s'], '{:.2f}')} | "
                      f"{cell(r['rollout/policy_tokens'])} | {cell(r['sync/logprob_diff'], '{:.2g}')} |")


def parse_shape(s: str, n: int) -> tuple[int, ...]:
    parts = tuple(int(x) for x in s.lower().split("x"))
    if len(parts) != n or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: want {'x'.join(['N'] * n)}")
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    ap.add_argument("--shapes", nargs="+", type=lambda s: parse_shape(s, 2), default=[(64, 64), (8, 256)],
                    help="prompts x new tokens")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    ap.add_argument("--repeats", type=int, default=2, help="calls per cell; the fastest counts")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: leave the default); also VLLM_CPU_OMP_THREADS_BIND=0-(N-1) unless set")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: CPU seconds of this process and its children (vLLM's engine core, the server)")
    ap.add_argument("--grpo-shape", type=lambda s: parse_shape(s, 3), default=(8, 8, 64),
                    help="prompts x group x max new tokens of table 2")
    ap.add_argument("--grpo-steps", type=int, default=3, help="steps per GRPO run (the first is not counted)")
    ap.add_argument("--grpo-sizes", nargs="*", choices=SIZES + ("model",), default=None,
                    help="sizes of table 2 (default: --sizes, none with --model; none: skip table 2; model: --model's)")
    ap.add_argument("--model", default="", metavar="SPEC",
                    help="a real model instead of --sizes: a Hugging Face folder or a name trajtune.models.hub "
                         "resolves (smollm2-135m); prompts in its chat template")
    ap.add_argument("--vllm-memory", type=float, default=0.3,
                    help="vLLM's --gpu-memory-utilization (its CPU build: the share of this machine's memory it takes)")
    args = ap.parse_args()
    model_dir = resolve(args.model) if args.model else None
    if model_dir is not None:
        args.sizes = ["model"]
        args.grpo_sizes = args.grpo_sizes if args.grpo_sizes is not None else []
    elif "model" in (args.grpo_sizes or []):
        ap.error("--grpo-sizes model needs --model")
    global CLOCK
    CLOCK = cpu_clock if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    grpo_sizes = args.sizes if args.grpo_sizes is None else args.grpo_sizes
    args.grpo_steps = max(args.grpo_steps, 2)
    try:
        import transformers
        tv = transformers.__version__
    except ImportError:
        tv = "-"
    try:
        import vllm
        vv = vllm.__version__
    except Exception as e:  # noqa: BLE001
        vv = f"not importable ({type(e).__name__})"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# generation benchmark: torch {torch.__version__}, transformers {tv}, vllm {vv}; {cores} cores, "
          f"{torch.get_num_threads()} torch threads, {args.clock} clock, load average {load()}; fp32, CPU: vLLM's CPU "
          "build with enforce_eager. Wall times on a shared "
          "machine measure its load as much as the code: compare the ratios, and rerun on an idle machine.",
          flush=True)
    results, grpo, params = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as d:
        work = Path(d)
        for size in dict.fromkeys(list(args.sizes) + list(grpo_sizes)):
            model_dir = make_model(work, size) if size != "model" else model_dir
            cfg = json.loads((model_dir / "config.json").read_text())
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
            params[size] = sum(p.numel() for p in m.parameters())
            print(f"\n[{size}] {model_dir if size == 'model' else ''} {params[size] / 1e6:.2f}M params, "
                  f"hidden {cfg['hidden_size']}, "
                  f"{cfg['num_hidden_layers']} layers, head size {cfg['hidden_size'] // cfg['num_attention_heads']}, "
                  f"vocab {cfg['vocab_size']}", flush=True)
            if size in args.sizes:
                results[size] = tokens_per_s(size, model_dir, args, work)
            if size in grpo_sizes:
                for backend in args.backends:
                    print(f"[{size}] GRPO with {backend}", flush=True)
                    grpo[(size, backend)] = r = grpo_step(model_dir, backend, args, work, f"{size}-{backend}")
                    print(f"  {r}", flush=True)
    print_tables(results, grpo, args, params)
    print(f"\nload average at the end: {load()}")


if __name__ == "__main__":
    main()
