"""Two gloo processes reproduce one process (trajtune.engine.distributed).

One `torch.multiprocessing` job of 2 CPU processes runs every scenario below
(DDP engine with the three aggregations and micro-batches, SFT, GRPO with a group
split across the ranks, FSDP2, iw-SFT with its lagged q under DDP and FSDP2); rank 0 writes what it saw and the
tests compare it with a one-process engine run in this process with the same global batch and seed.
A second job kills one rank mid-run and checks the last checkpoint loads.

Why 2 processes match 1 to ~1e-7 rather than bitwise: each rank runs its rows
as a smaller batch and the gradients are summed in a different order (two
partial sums, then an all-reduce), so float32 rounding differs in the last bits.
Gradients and losses therefore agree within TOL = 1e-5 (asserted). Parameters
after several AdamW steps agree within TOL on all but a handful of coordinates:
Adam divides each coordinate's step by its own gradient scale, so a coordinate
whose exact gradient is zero (the key bias: softmax ignores a constant added to
every key) or tiny (a nearly dead MLP unit) takes a step of size ~lr * noise /
(|noise| + eps) driven by that rounding noise. We bound those: at most 0.2% of
coordinates beyond TOL and none beyond PARAM_TOL = 2e-2 * lr. Measured (print with -s):
with rank shards of contiguous rows, SFT 1.4e-4 on 28 of ~27k coordinates -- 20 key-bias
entries (|grad| ~1e-11, zero up to rounding) and 2 MLP entries of a unit whose |grad| is
~4e-9, under Adam's eps -- GRPO similar. (With the earlier shards, rows i and i + n/2
together, the same run measured 4e-5 on 7; the bound was then 1e-2 * lr.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from trajtune.algorithms.iw_sft import IWSFTConfig, train_iw_sft
from trajtune.algorithms.rl import RLConfig, advantages_for, train_rl
from trajtune.algorithms.sft import SFTConfig, sft_loss_fn, train_sft
from trajtune.engine import OptimConfig, make_engine
from trajtune.runs.loop import Run
from trajtune.envs.base import SingleTurnEnv
from trajtune.logprobs import aggregation_share
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sources.episodes import EpisodeSource
from trajtune.trajectory import collate
from trajtune.sources.sampler import Decoder, SamplerSettings

from test_algorithms import RENDER, TASKS, TOK  # noqa: E402 - the same toy task as the single-process tests
from test_reliability import NanOnToken  # noqa: E402 - the same poisoned model
OPT = OptimConfig(lr=1e-2)
SFT = SFTConfig(steps=4, batch_size=6, seed=3)
GRPO = RLConfig(steps=3, tasks_per_step=3, group_size=3, advantage="grpo", seed=5)  # 9 episodes: 5 | 4 split group 1
IW = IWSFTConfig(rounds=2, samples_per_task=3, steps_per_round=2, batch_size=6, q_update_every=1, threshold=0.0,
                seed=7)  # a q per round, refreshed before its step 1: 2 refreshes
# (mode, micro_batch_size)
AGGREGATIONS = [("token", 0), ("sequence", 0), ("constant", 0), ("token", 1), ("sequence", 2)]
TOL = 1e-5
PARAM_TOL = 2e-2 * OPT.lr  # see the module docstring: Adam on zero-gradient coordinates


def assert_params_close(ours: dict, theirs: dict, what: str) -> None:
    diff = torch.cat([(ours[k] - theirs[k]).abs().flatten() for k in ours])
    n_off = int((diff > TOL).sum())
    print(f"{what} 1 vs 2 processes: max |param diff| {float(diff.max()):.2e}, {n_off} of {diff.numel()} beyond {TOL}")
    assert float(diff.max()) < PARAM_TOL and n_off <= 0.002 * diff.numel()


def verifier(task, reply):
    return float(reply.startswith("a")), {}


def new_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=2, n_heads=2, max_len=32))


def demos():
    replies = ["a", "bb", "abc", "cab", "f", "de", "ace", "bad"]  # different lengths: token != sequence mean
    return [RENDER.render([{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": r}])
            for r in replies]


def collect_for(engine, shard=None):
    return EpisodeSource(Decoder(engine.sample, SamplerSettings(max_new_tokens=3)), lambda: SingleTurnEnv(verifier),
                         RENDER, shard=shard, episode_seeds=True, max_turns=1, max_tokens=32)


def grads(engine) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in engine.model.named_parameters() if p.grad is not None}


def params(model) -> dict[str, torch.Tensor]:
    """The full parameters (FSDP2's shards gathered: every rank must call it)."""
    full = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p  # noqa: E731
    return {n: full(p).detach().clone().contiguous() for n, p in model.named_parameters()}


def local_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Max |a - b| over this process's part of every parameter (FSDP2: its shards, no communication)."""
    for m in [*a.modules(), *b.modules()]:  # FSDP2 leaves the root's parameters gathered after a forward
        if hasattr(m, "reshard"):
            m.reshard()
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p  # noqa: E731
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max(float((local(p) - local(q)).detach().abs().max()) if local(p).numel() else 0.0 for p, q in pairs)


def iw_sft_checking_q(engine) -> tuple[list[dict], list[list]]:
    """iw-SFT with its lagged q watched: at every refresh, (max |q - policy| before, after, q sharded?) on
    this rank's part of the weights."""
    refreshes: list[list] = []
    make_reference = engine.reference_engine

    def reference_engine(**kw):
        q = make_reference(**kw)
        copy = q.copy_weights_from

        def watched(other):
            before = local_diff(q.model, other.model)
            copy(other)
            sharded = all(type(p).__name__ == "DTensor" for p in q.model.parameters())
            refreshes.append([before, local_diff(q.model, other.model), sharded])

        q.copy_weights_from = watched
        return q

    engine.reference_engine = reference_engine
    history = train_iw_sft(engine, TASKS, collect_for(engine, engine.shard), IW, TOK.pad_id)
    return history, refreshes


NAN_TOKEN = 2  # the token test_reliability.NanOnToken turns into NaN logits


# --- the 2-process job -------------------------------------------------------------
def _init(rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from trajtune.engine.distributed import init_distributed

    init_distributed("gloo")


def _worker(rank: int, port: int, out: str) -> None:
    _init(rank, port)
    from trajtune.engine import make_engine

    out_dir = Path(out)
    tensors, record = {}, {}
    # 1. one forward_backward per aggregation (5 rows: 3 | 2; 1 row: rank 1 only keeps step)
    for mode, mbs in AGGREGATIONS:
        for n in (5, 1):
            e = make_engine(new_model(), OPT, micro_batch_size=mbs)
            batch = collate(demos()[:n], TOK.pad_id)
            m = e.forward_backward(batch, sft_loss_fn(mode, 7.0))
            tensors.update({f"agg/{mode}/{mbs}/{n}/{k}": v for k, v in grads(e).items()})
            tensors[f"agg/{mode}/{mbs}/{n}/logprobs"] = e.forward(batch).logprobs
            record[f"agg/{mode}/{mbs}/{n}"] = m
    # 2. SFT through the unchanged loop
    e = make_engine(new_model(), OPT)
    assert e.collective.ranks.world_size == 2 and type(e.collective).__name__ == "DDP"
    record["sft"] = [h["train/loss"] for h in train_sft(e, demos(), SFT, TOK.pad_id)]
    tensors.update({f"sft/{k}": v for k, v in params(e.model).items()})
    # 3. GRPO: rollouts sharded by episode, gathered before the group baselines
    e = make_engine(new_model(), OPT)
    hist = train_rl(e, TASKS, collect_for(e, e.shard), GRPO, TOK.pad_id)
    record["grpo"] = [h["train/loss"] for h in hist]
    record["grpo_reward"] = [h["rollout/reward"] for h in hist]
    tensors.update({f"grpo/{k}": v for k, v in params(e.model).items()})
    # 4. one collect: which episodes this rank ran, and the advantages of the gathered batch
    trajs = collect_for(e, e.shard).run(TASKS[:3], 3, torch.Generator().manual_seed(11))
    batch = collate(trajs, TOK.pad_id)
    adv, _ = advantages_for(batch, GRPO, None, None, None)
    record["adv"] = {"rows": e.shard.rows(9), "groups": batch.groups.tolist(), "rewards": batch.rewards.tolist(),
                     "advantages": adv.tolist(), "actions": [t.tokens_of(2) for t in trajs]}
    # 5. FSDP2: two SFT steps, a sample with a different number of prompts per rank, save / load
    f = make_engine(new_model(), OPT, strategy="fsdp")
    record["fsdp"] = [h["train/loss"]
                      for h in train_sft(f, demos(), SFTConfig(steps=2, batch_size=6, seed=3), TOK.pad_id)]
    prompts = [RENDER.prompt_ids(RENDER.start([{"role": "user", "content": "Q: pick"}]))] * (2 - rank)
    record[f"fsdp_sample_{rank}"] = f.sample(prompts, 3, greedy=True).tokens
    f.save_state(out_dir / "fsdp_state")
    g = make_engine(new_model(seed=9), OPT, strategy="fsdp")
    g.load_state(out_dir / "fsdp_state")
    batch = collate(demos(), TOK.pad_id)
    record["fsdp_reload_diff"] = float((g.forward(batch).logprobs - f.forward(batch).logprobs).abs().max())
    record["fsdp_step"] = g.step
    samples = [None, None]
    torch.distributed.all_gather_object(samples, record[f"fsdp_sample_{rank}"])
    record["fsdp_samples"] = samples
    # 6. an interrupt seen by rank 1 only: both ranks save after the same step, and resume exactly
    from trajtune.runs.resume import Checkpointer, RunInterrupted

    def only_rank_1(step):
        if rank == 1 and step == 1:
            ck.stop_requested = True
        return {}

    cut = make_engine(new_model(), OPT)
    ck = Checkpointer(out_dir / "resume")
    try:
        train_sft(cut, demos(), dataclasses.replace(SFT, eval_every=1), TOK.pad_id,
                  Run("sft", evaluate=only_rank_1, checkpointer=ck))
        record[f"interrupted_{rank}"] = None
    except RunInterrupted as e:
        record[f"interrupted_{rank}"] = str(e)
    resumed = make_engine(new_model(seed=9), OPT)
    train_sft(resumed, demos(), SFT, TOK.pad_id, Run("sft", checkpointer=Checkpointer(out_dir / "resume")))
    tensors.update({f"resumed/{k}": v for k, v in params(resumed.model).items()})
    interrupted = [None, None]
    torch.distributed.all_gather_object(interrupted, record[f"interrupted_{rank}"])
    record["interrupted"] = interrupted
    # 7. a NaN loss in rank 1's rows only: both ranks skip the step (weights unchanged) and name the row
    from trajtune.engine import NonFiniteError

    data = demos()
    for i, t in enumerate(data):
        t.info["source"] = f"chats.jsonl:{i + 1}"
    data[6].ids[2] = NAN_TOKEN  # rows 0-3 are rank 0's, rows 4-7 rank 1's
    skip = make_engine(NanOnToken(new_model()), OPT)
    before = params(skip.model)
    skip.forward_backward(collate(data, TOK.pad_id), sft_loss_fn())
    record[f"nan_skipped_{rank}"] = skip.optim_step()["skipped"]
    record[f"nan_unchanged_{rank}"] = _max_diff(before, params(skip.model)) == 0.0
    stop = make_engine(NanOnToken(new_model()), dataclasses.replace(OPT, on_nonfinite="stop"))
    stop.forward_backward(collate(data, TOK.pad_id), sft_loss_fn())
    try:
        stop.optim_step()
        record[f"nan_message_{rank}"] = None
    except NonFiniteError as err:
        record[f"nan_message_{rank}"] = str(err)
    # 8. iw-SFT under DDP and FSDP2: q <- policy by `copy_weights_from`, each rank its own part
    for strategy in ("ddp", "fsdp"):
        e = make_engine(new_model(), OPT, strategy=strategy)
        hist, record[f"iw_{strategy}_refreshes_{rank}"] = iw_sft_checking_q(e)
        record[f"iw_{strategy}"] = [h["train/loss"] for h in hist]
        tensors.update({f"iw_{strategy}/{k}": v for k, v in params(e.model).items()})
    mine = {k: v for k, v in record.items() if k.startswith(("nan_", "iw_"))}
    everyone = [None, None]
    torch.distributed.all_gather_object(everyone, mine)
    for part in everyone:
        record.update(part)
    if rank == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "tensors.safetensors"))
        (out_dir / "record.json").write_text(json.dumps(record))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return json.loads((out / "record.json").read_text()), load_file(str(out / "tensors.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --- the tests ---------------------------------------------------------------------
def test_aggregation_share_splits_each_mode_exactly():
    batch = collate(demos()[:5], TOK.pad_id)
    per_tok = torch.randn(batch.action_mask.shape)
    from trajtune.logprobs import aggregate

    for mode in ("token", "sequence", "constant"):
        whole = aggregate(per_tok, batch.action_mask, mode, 7.0)
        parts = [torch.arange(0, 2), torch.arange(2, 5)]
        split = sum(aggregation_share(batch.action_mask[r], batch.action_mask, mode)
                    * aggregate(per_tok[r], batch.action_mask[r], mode, 7.0) for r in parts)
        assert torch.allclose(whole, split, atol=1e-6), mode


@pytest.mark.parametrize("mode,mbs", AGGREGATIONS)
@pytest.mark.parametrize("n", [5, 1])
def test_sharded_gradient_equals_one_process(two_procs, mode, mbs, n):
    record, tensors = two_procs
    e = make_engine(new_model(), OPT)
    batch = collate(demos()[:n], TOK.pad_id)
    m = e.forward_backward(batch, sft_loss_fn(mode, 7.0))
    key = f"agg/{mode}/{mbs}/{n}"
    theirs = {k.removeprefix(key + "/"): v for k, v in tensors.items()
              if k.startswith(key + "/") and not k.endswith("logprobs")}
    assert _max_diff(grads(e), theirs) < TOL
    assert abs(record[key]["loss"] - m["loss"]) < TOL
    if mode == "token":  # a metric is exact when it is aggregated like the loss (sft/nll is a token mean)
        assert abs(record[key]["sft/nll"] - m["sft/nll"]) < TOL
    assert torch.allclose(tensors[key + "/logprobs"], e.forward(batch).logprobs, atol=TOL)


def test_sft_two_processes_match_one(two_procs):
    record, tensors = two_procs
    e = make_engine(new_model(), OPT)
    losses = [h["train/loss"] for h in train_sft(e, demos(), SFT, TOK.pad_id)]
    loss_diff = max(abs(a - b) for a, b in zip(losses, record["sft"], strict=True))
    print(f"SFT 1 vs 2 processes: max |loss diff| {loss_diff:.2e}")
    assert loss_diff < TOL
    assert_params_close(params(e.model), {k[4:]: v for k, v in tensors.items() if k.startswith("sft/")}, "SFT")


def test_grpo_two_processes_match_one(two_procs):
    record, tensors = two_procs
    e = make_engine(new_model(), OPT)
    hist = train_rl(e, TASKS, collect_for(e), GRPO, TOK.pad_id)
    assert [h["rollout/reward"] for h in hist] == record["grpo_reward"]  # the same episodes were sampled
    loss_diff = max(abs(h["train/loss"] - b) for h, b in zip(hist, record["grpo"], strict=True))
    print(f"GRPO 1 vs 2 processes: max |loss diff| {loss_diff:.2e}")
    assert loss_diff < TOL
    assert_params_close(params(e.model), {k[5:]: v for k, v in tensors.items() if k.startswith("grpo/")}, "GRPO")


def test_group_split_across_ranks_gets_one_process_advantages(two_procs):
    record, tensors = two_procs
    adv = record["adv"]
    assert adv["rows"] == [0, 1, 2, 3, 4]  # rank 0 ran episodes 0-4: group 1 (episodes 3, 4, 5) spans both ranks
    e = make_engine(new_model(), OPT)  # the policy the 2-process run sampled with (after its GRPO steps)
    e.model.load_state_dict({k[5:]: v for k, v in tensors.items() if k.startswith("grpo/")})
    trajs = collect_for(e).run(TASKS[:3], 3, torch.Generator().manual_seed(11))
    batch = collate(trajs, TOK.pad_id)
    ours, _ = advantages_for(batch, GRPO, None, None, None)
    assert [t.tokens_of(2) for t in trajs] == adv["actions"]
    assert batch.groups.tolist() == adv["groups"] and batch.rewards.tolist() == adv["rewards"]
    assert torch.allclose(ours, torch.tensor(adv["advantages"]), atol=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_iw_sft_two_processes_match_one_and_q_is_the_policy_after_each_refresh(two_procs, strategy):
    record, tensors = two_procs
    e = make_engine(new_model(), OPT)
    hist, refreshes = iw_sft_checking_q(e)
    losses = [h["train/loss"] for h in hist]
    loss_diff = max(abs(a - b) for a, b in zip(losses, record[f"iw_{strategy}"], strict=True))
    print(f"iw-SFT ({strategy}) 1 vs 2 processes: max |loss diff| {loss_diff:.2e}")
    assert loss_diff < TOL
    theirs = {k.removeprefix(f"iw_{strategy}/"): v for k, v in tensors.items() if k.startswith(f"iw_{strategy}/")}
    assert_params_close(params(e.model), theirs, f"iw-SFT ({strategy})")
    sharded = strategy == "fsdp"
    for part in (refreshes, record[f"iw_{strategy}_refreshes_0"], record[f"iw_{strategy}_refreshes_1"]):
        assert len(part) == 2  # every refresh happened: q lagged behind the policy, then equals it, bit for bit
        assert all(before > 0 and after == 0.0 for before, after, _ in part), part
    assert all(s == sharded for _, _, s in record[f"iw_{strategy}_refreshes_0"] + record[f"iw_{strategy}_refreshes_1"])


def test_copy_weights_from_copies_values_not_tensors_and_refuses_another_architecture():
    a, b = make_engine(new_model(seed=1), OPT), make_engine(new_model(seed=2), OPT)
    a.copy_weights_from(b)
    assert _max_diff(params(a.model), params(b.model)) == 0.0
    b.forward_backward(collate(demos(), TOK.pad_id), sft_loss_fn())
    b.optim_step()
    assert _max_diff(params(a.model), params(b.model)) > 0  # a copy, not the same tensors
    wide = make_engine(TinyTransformer(TinyConfig(TOK.vocab_size, dim=16, n_layers=2, n_heads=2, max_len=32)), OPT)
    with pytest.raises(ValueError, match="copy_weights: tok_emb.weight is"):
        a.copy_weights_from(wide)


def test_fsdp2_matches_one_process_and_checkpoints(two_procs):
    record, _ = two_procs
    e = make_engine(new_model(), OPT)
    losses = [h["train/loss"] for h in train_sft(e, demos(), SFTConfig(steps=2, batch_size=6, seed=3), TOK.pad_id)]
    assert max(abs(a - b) for a, b in zip(losses, record["fsdp"], strict=True)) < TOL
    assert record["fsdp_reload_diff"] < 1e-6 and record["fsdp_step"] == 2
    prompt = RENDER.prompt_ids(RENDER.start([{"role": "user", "content": "Q: pick"}]))
    greedy = e.sample([prompt], 3, greedy=True).tokens[0]
    assert record["fsdp_samples"] == [[greedy, greedy], [greedy]]


# --- a rank dies mid-run ---------------------------------------------------------------
def _dying_worker(rank: int, port: int, out: str) -> None:
    _init(rank, port)
    from trajtune.engine import make_engine

    e = make_engine(new_model(), OPT)
    batch = collate(demos(), TOK.pad_id)
    for step in range(20):
        e.forward_backward(batch, sft_loss_fn())
        e.optim_step()
        e.save_state(Path(out) / "ckpt", extra={"step": step + 1})
        if rank == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0 is in its next step or writing the checkpoint


def test_an_interrupt_seen_by_one_rank_stops_both_and_resumes_exactly(two_procs):
    record, tensors = two_procs
    assert record["interrupted"] == ["interrupted after step 1; checkpoint in "
                                     + record["interrupted"][0].split(" in ")[1]] * 2
    assert _max_diff({k[8:]: v for k, v in tensors.items() if k.startswith("resumed/")},
                     {k[4:]: v for k, v in tensors.items() if k.startswith("sft/")}) == 0.0


def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank_and_names_the_row(two_procs):
    record, _ = two_procs
    assert record["nan_skipped_0"] == record["nan_skipped_1"] == 1.0
    assert record["nan_unchanged_0"] and record["nan_unchanged_1"]
    for rank in (0, 1):  # both ranks stop with the same message, naming rank 1's row
        assert "rank 1: non-finite log-probs in 1 row(s): chats.jsonl:7" in record[f"nan_message_{rank}"]
    assert record["nan_message_0"] == record["nan_message_1"]


def test_killing_a_rank_leaves_the_last_checkpoint_loadable(tmp_path):
    ctx = mp.start_processes(_dying_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    with pytest.raises(mp.ProcessExitedException):  # rank 1 died; rank 0 is then terminated (SIGTERM, then SIGKILL)
        while not ctx.join(grace_period=1):
            pass
    e = make_engine(new_model(seed=1), OPT)
    extra = e.load_state(tmp_path / "ckpt")
    assert extra["step"] == e.step and e.step >= 3
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["ckpt"]
