"""Every mismatch correction (objectives.corrections) chosen on a real lagged loop: a sampler process one update
behind (max_staleness 1), the RLConfig key doing the choosing, every metric it logs documented. Step 0 is sampled
by the weights it trains (the sampler's and the trainer's log-probs agree to float rounding), so no correction cuts
anything there; from step 1 the sampler is an update behind and a tight bound cuts some tokens."""

import pytest

from trajtune.algorithms.rl import RLConfig
from trajtune.metrics import MetricsLogger
from trajtune.runs.loop import Run

from test_async_rl import ahead, engine, train

TIGHT = {"correction_low": 0.999, "correction_high": 1.001}


@pytest.mark.parametrize("kw, cut", [
    ({"tis_cap": 1.001}, "pg/tis_capped_frac"),  # tis_cap alone: token TIS, as before the choice existed
    ({"correction": "tis_seq", "tis_cap": 1.001}, "pg/tis_capped_frac"),
    ({"correction": "mis_token", **TIGHT}, "pg/correction_masked_frac"),
    ({"correction": "mis_seq", **TIGHT}, "pg/correction_masked_frac"),
    ({"correction": "mis_geo"}, "pg/correction_masked_frac"),  # its default band is this tight
    ({"correction": "mis_veto", **TIGHT}, "pg/correction_masked_frac"),
    ({"correction": "icepop", **TIGHT}, "pg/correction_masked_frac"),
    ({"correction": "decoupled", "surrogate": "ppo", "epochs": 2, "tis_cap": 1.001}, "pg/correction_masked_frac"),
], ids=lambda x: x.get("correction", "tis") if isinstance(x, dict) else None)
def test_each_correction_runs_lagged_cuts_nothing_on_policy_and_something_behind(tmp_path, kw, cut):
    e = engine()
    cfg = RLConfig(steps=3, tasks_per_step=4, group_size=8, advantage="grpo", seed=1, **kw)
    with MetricsLogger(tmp_path, strict=True) as log:  # strict: an undocumented metric name fails here
        hist = train(e, ahead(e), cfg, Run("t", log))
    assert hist[0][cut] == 0.0, hist[0]
    assert max(h[cut] for h in hist[1:]) > 0.0, [h[cut] for h in hist]
