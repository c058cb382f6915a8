"""The train-inference mismatch corrections (objectives.corrections), by hand, and their selection from
PGOptions, RLConfig, the sampling check, recipes and the `trajtune grpo` command line.

The batch every test uses: two rows, three predicted tokens, the second row's last one padding. Per POLICY token
the ratio rho = pi_target / pi_sampler is

    row 0:  1.5   3.0   0.4        (the sequence product 1.8, geometric mean 1.8^(1/3) = 1.2164)
    row 1:  0.8   1.1   [pad]      (the sequence product 0.88, geometric mean 0.88^(1/2) = 0.9381)

and the padding's log-ratio is garbage (+50) that no correction may read.
"""

import math
import re

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, pg_options
from trajtune.cli import build_parser, main
from trajtune.config import from_dict
from trajtune.objectives.corrections import correction_weights, mis_mask, truncated_is_weights
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import policy_gradient_loss
from trajtune.sources.sampling import SamplingConfig, check_sampling

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
SAMPLER = torch.full((2, 3), -2.0)
TARGET = SAMPLER + torch.tensor([[math.log(1.5), math.log(3.0), math.log(0.4)],
                                 [math.log(0.8), math.log(1.1), 50.0]])


def weights(correction, **kw):
    return correction_weights(correction, TARGET, SAMPLER, MASK, **kw)


def close(got: torch.Tensor, want: list[list[float]]) -> None:
    """Equal on the POLICY tokens (the padding's weight is never read)."""
    torch.testing.assert_close(got * MASK, torch.tensor(want) * MASK, atol=1e-6, rtol=1e-6)


def test_token_tis_truncates_each_token_at_the_cap():
    w, m = weights("tis", cap=2.0)
    close(w, [[1.5, 2.0, 0.4], [0.8, 1.1, 0.0]])  # 3.0 -> 2.0
    assert m["pg/tis_weight_mean"].item() == pytest.approx((1.5 + 2.0 + 0.4 + 0.8 + 1.1) / 5)  # 1.16
    assert m["pg/tis_capped_frac"].item() == pytest.approx(1 / 5)
    assert set(m) == {"pg/tis_weight_mean", "pg/tis_capped_frac"}  # the metrics the loop has always logged
    assert torch.equal(w, truncated_is_weights(TARGET, SAMPLER, 2.0))


def test_sequence_tis_weights_every_token_by_its_rows_truncated_product():
    w, m = weights("tis_seq", cap=2.0)
    close(w, [[1.8, 1.8, 1.8], [0.88, 0.88, 0.0]])  # 1.5 x 3 x 0.4 = 1.8; 0.8 x 1.1 = 0.88: under the cap
    assert m["pg/tis_weight_mean"].item() == pytest.approx((3 * 1.8 + 2 * 0.88) / 5)  # 1.432
    assert m["pg/tis_capped_frac"].item() == 0.0 and m["pg/correction_seq_frac"].item() == 0.0
    w, m = weights("tis_seq", cap=1.5)  # row 0's 1.8 is cut to 1.5
    close(w, [[1.5, 1.5, 1.5], [0.88, 0.88, 0.0]])
    assert m["pg/tis_weight_mean"].item() == pytest.approx((3 * 1.5 + 2 * 0.88) / 5)  # 1.252
    assert m["pg/tis_capped_frac"].item() == pytest.approx(3 / 5) and m["pg/correction_seq_frac"].item() == 0.5


def test_token_mis_masks_the_tokens_outside_the_band():
    w, m = weights("mis_token")  # default [0.5, 2]: 3.0 and 0.4 are out
    close(w, [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert m["pg/correction_masked_frac"].item() == pytest.approx(2 / 5)
    assert m["pg/correction_seq_frac"].item() == 0.5  # row 0 lost a token, row 1 none
    w, _ = weights("mis_token", band=(0.3, 3.5))  # everything in
    close(w, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_sequence_mis_masks_rows_whose_product_is_outside_the_band():
    w, m = weights("mis_seq")  # 1.8 and 0.88 are both in [0.5, 2]
    close(w, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert m["pg/correction_masked_frac"].item() == 0.0
    w, m = weights("mis_seq", band=(0.9, 2.0))  # 0.88 < 0.9: row 1 out
    close(w, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert m["pg/correction_masked_frac"].item() == pytest.approx(2 / 5) and m["pg/correction_seq_frac"].item() == 0.5


def test_geometric_mis_masks_rows_by_the_geometric_mean_of_their_ratios():
    # geometric means: row 0 1.8^(1/3) = 1.2164, row 1 0.88^(1/2) = 0.9381
    w, m = weights("mis_geo", band=(0.95, 1.25))  # row 1 under 0.95
    close(w, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert m["pg/correction_masked_frac"].item() == pytest.approx(2 / 5)
    w, m = weights("mis_geo", band=(0.95, 1.2))  # and row 0 over 1.2
    assert m["pg/correction_masked_frac"].item() == 1.0 and m["pg/correction_seq_frac"].item() == 1.0
    w, m = weights("mis_geo")  # the default [0.999, 1.001] is for a mismatch of rounding: both rows out here
    assert m["pg/correction_masked_frac"].item() == 1.0


def test_veto_masks_the_whole_row_of_one_outlying_token_and_ignores_padding():
    w, m = weights("mis_veto", band=(0.5, 2.0))  # row 0 has 3.0 and 0.4; row 1's padding (e^50) does not count
    close(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert m["pg/correction_masked_frac"].item() == pytest.approx(3 / 5) and m["pg/correction_seq_frac"].item() == 0.5
    w, _ = weights("mis_veto")  # default [1e-4, 1e4]: nothing here is catastrophic
    close(w, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_icepop_keeps_the_ratio_inside_the_band_and_drops_both_sides():
    w, m = weights("icepop")  # default [0.5, 5]: 0.4 is under, nothing over
    close(w, [[1.5, 3.0, 0.0], [0.8, 1.1, 0.0]])
    assert m["pg/correction_weight_mean"].item() == pytest.approx((1.5 + 3.0 + 0.8 + 1.1) / 5)  # 1.28
    assert m["pg/correction_masked_frac"].item() == pytest.approx(1 / 5)
    w, m = weights("icepop", band=(0.5, 2.0))  # now 3.0 is over too
    close(w, [[1.5, 0.0, 0.0], [0.8, 1.1, 0.0]])
    assert m["pg/correction_masked_frac"].item() == pytest.approx(2 / 5)


def test_decoupled_behaviour_weight_drops_the_tokens_over_the_cap_or_keeps_all():
    w, m = weights("decoupled", cap=2.0)  # pi_prox / pi_sampler; 3.0 > 2 is dropped, not truncated
    close(w, [[1.5, 0.0, 0.4], [0.8, 1.1, 0.0]])
    assert m["pg/correction_weight_mean"].item() == pytest.approx((1.5 + 0.4 + 0.8 + 1.1) / 5)  # 0.76
    assert m["pg/correction_masked_frac"].item() == pytest.approx(1 / 5)
    w, m = weights("decoupled")  # no cap: the plain behaviour weight
    close(w, [[1.5, 3.0, 0.4], [0.8, 1.1, 0.0]])
    assert m["pg/correction_masked_frac"].item() == 0.0


def test_staleness_splits_the_cut_share_into_fresh_and_stale_tokens():
    staleness = torch.tensor([[0, 0, 1], [1, 1, -1]])
    _, m = weights("mis_token", staleness=staleness)  # cut: (0,1) fresh, (0,2) stale
    assert m["pg/correction_fresh_frac"].item() == pytest.approx(1 / 2)  # fresh tokens (0,0), (0,1)
    assert m["pg/correction_stale_frac"].item() == pytest.approx(1 / 3)  # stale (0,2), (1,0), (1,1)
    _, m = weights("tis", cap=2.0, staleness=staleness)  # clipped: (0,1), fresh
    assert m["pg/correction_fresh_frac"].item() == 0.5 and m["pg/correction_stale_frac"].item() == 0.0


def test_the_levels_and_corrections_are_named():
    with pytest.raises(ValueError, match="unknown MIS level 'row'"):
        mis_mask(TARGET, SAMPLER, MASK, "row", 0.5, 2.0)
    with pytest.raises(ValueError, match="unknown correction 'mis'; choose one of none, tis, tis_seq, mis_token"):
        weights("mis")
    w, m = weights("none")
    assert torch.equal(w, torch.ones(2, 3)) and m == {}


# --- in the loss --------------------------------------------------------------------------------------------
def test_a_masked_token_gets_no_gradient_and_keeps_its_place_in_the_denominator():
    logp = TARGET.clone().requires_grad_(True)  # on-policy REINFORCE: the target is the policy itself
    loss, m = policy_gradient_loss(logp, MASK, PGInputs(torch.tensor([1.0, -1.0]), sampler_logp=SAMPLER),
                                   PGOptions(correction="mis_token"))
    loss.backward()
    # per token -A w log pi, mean over the 5 POLICY tokens: d/d log pi = -A w / 5
    close(logp.grad, [[-0.2, 0.0, 0.0], [0.2, 0.2, 0.0]])
    assert logp.grad[1, 2] == 0 and m["pg/correction_masked_frac"].item() == pytest.approx(2 / 5)


def test_decoupled_ppo_weights_the_ratio_against_the_proximal_policy():
    prox = TARGET[:1]  # one row: behaviour weights 1.5, 3.0 (over the cap 2: dropped), 0.4
    logp = prox.clone().requires_grad_(True)  # pi = pi_prox: ratio 1, inside the clip
    loss, m = policy_gradient_loss(logp, MASK[:1], PGInputs(torch.tensor([1.0]), old_logp=prox,
                                                            sampler_logp=SAMPLER[:1]),
                                   PGOptions(surrogate="ppo", correction="decoupled", tis_cap=2.0))
    assert loss.item() == pytest.approx(-(1.5 + 0.0 + 0.4) / 3)  # -A rho w per token, rho = 1
    loss.backward()
    close(logp.grad, [[-1.5 / 3, 0.0, -0.4 / 3]])  # d(-A rho w)/d log pi = -A rho w
    assert m["pg/correction_weight_mean"].item() == pytest.approx(1.9 / 3)
    with pytest.raises(ValueError, match="'decoupled' clips against the proximal policy: it needs old_logp"):
        policy_gradient_loss(logp, MASK[:1], PGInputs(torch.tensor([1.0]), sampler_logp=SAMPLER[:1]),
                             PGOptions(surrogate="ppo", correction="decoupled"))


def test_tis_cap_alone_and_correction_tis_compute_the_same_bits():
    for surrogate, old in (("reinforce", None), ("ppo", TARGET - 0.1)):
        logp = TARGET.clone()
        inputs = PGInputs(torch.tensor([1.0, -0.5]), old_logp=old, sampler_logp=SAMPLER)
        a = policy_gradient_loss(logp, MASK, inputs, PGOptions(surrogate=surrogate, tis_cap=2.0))
        b = policy_gradient_loss(logp, MASK, inputs, PGOptions(surrogate=surrogate, correction="tis", tis_cap=2.0))
        assert torch.equal(a[0], b[0]) and list(a[1]) == list(b[1])
        assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_sampler_logp_and_a_correction_go_together():
    logp = TARGET.clone()
    with pytest.raises(ValueError, match="needs both sampler_logp and a correction"):
        policy_gradient_loss(logp, MASK, PGInputs(torch.tensor([1.0, 1.0])), PGOptions(correction="icepop"))
    with pytest.raises(ValueError, match="needs both sampler_logp and a correction"):
        policy_gradient_loss(logp, MASK, PGInputs(torch.tensor([1.0, 1.0]), sampler_logp=SAMPLER), PGOptions())


# --- selection: options, RLConfig, recipes, the command line, the sampling check ------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"correction": "tis"}, "correction 'tis' truncates the importance weight at tis_cap: set it"),
    ({"correction": "tis_seq"}, "correction 'tis_seq' truncates the importance weight at tis_cap"),
    ({"correction": "icepop", "tis_cap": 2.0}, "tis_cap is the cap of tis / tis_seq / decoupled; correction 'icepop'"),
    ({"correction": "tis", "tis_cap": 2.0, "correction_high": 3.0}, "correction 'tis' has no band"),
    ({"correction": "mis_token", "correction_low": 2.0, "correction_high": 1.0}, r"need 0 <= low < high"),
    ({"correction": "mis_token", "correction_low": 0.5}, r"need 0 <= low < high, got \[0.5, 0.0\]"),
    ({"correction": "decoupled"}, "'decoupled' is PPO against the proximal policy pi_old: it needs a surrogate"),
    ({"correction": "mis_seq", "correction_low": -1.0}, "correction_low must be >= 0"),
])
def test_rlconfig_refuses_a_correction_without_its_bounds_naming_the_key(kw, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**kw)


def test_rlconfig_passes_the_correction_and_its_band_to_the_loss():
    o = pg_options(RLConfig(correction="icepop", correction_low=0.4, correction_high=4.0), 0.0)
    assert (o.active_correction, o.correction_band, o.tis_cap) == ("icepop", (0.4, 4.0), None)
    o = pg_options(RLConfig(tis_cap=2.0), 0.0)  # the spelling from before the choice: token TIS
    assert (o.active_correction, o.correction, o.tis_cap) == ("tis", "none", 2.0)
    o = pg_options(RLConfig(correction="decoupled", surrogate="ppo", tis_cap=3.0), 0.0)
    assert (o.active_correction, o.tis_cap, o.correction_band) == ("decoupled", 3.0, None)


def test_staleness_needs_a_correction_and_any_correction_will_do():
    check_sampling(SamplingConfig(max_staleness=1), "agent", rl=RLConfig(correction="icepop"))
    check_sampling(SamplingConfig(max_staleness=1), "agent", rl=RLConfig(correction="decoupled", surrogate="ppo"))
    with pytest.raises(ValueError, match=r"or choose another correction \(recipes: \[config.rl\] correction; "
                                         "the command line: --correction\\)"):
        check_sampling(SamplingConfig(max_staleness=1), "agent", rl=RLConfig())


def _grpo_argv(tmp_path, *flags):
    return ["grpo", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "none.jsonl"), "--reward", "r:f",
            *flags]


def test_the_command_line_and_recipes_select_a_correction(tmp_path, capsys):
    from trajtune.cli.hf import config_from_args
    from trajtune.experiments.hf.grpo import GRPORun

    args = build_parser().parse_args(_grpo_argv(tmp_path, "--correction", "mis_geo", "--correction-low", "0.99",
                                                "--correction-high", "1.01"))
    rl = config_from_args(args, GRPORun).rl
    assert (rl.correction, rl.correction_low, rl.correction_high) == ("mis_geo", 0.99, 1.01)
    recipe = from_dict(GRPORun, {"model": {"path": "m"}, "data": "d", "reward": ["r:f"],
                                 "rl": {"correction": "tis_seq", "tis_cap": 5.0}})
    assert pg_options(recipe.rl, 0.0).active_correction == "tis_seq"
    assert main(_grpo_argv(tmp_path, "--correction", "tis")) == 2
    err = capsys.readouterr().err
    assert re.search(r"--correction 'tis' truncates the importance weight at --tis-cap: set it", err), err
    assert "Traceback" not in err
    with pytest.raises(SystemExit):  # argparse's choice check
        main(_grpo_argv(tmp_path, "--correction", "icepops"))
    assert "invalid choice: 'icepops'" in capsys.readouterr().err
