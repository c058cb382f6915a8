"""Importance-weighted SFT ("Supervised Fine Tuning on Curated Data is Reinforcement Learning (and can be
improved)", part 2, §3.2-3.5: the seed iw-SFT, docs/seeds.md; REPRODUCE C1-C4), two experiments:

    bandit.py   the paper's two-arm bandit (§3.5): SFT's 2/3 fixed point, clipped / smoothed
                iw-SFT above it, too-peaked weights raising the spread              C1, C2, C3
    bugfix.py   iw-SFT vs plain expert iteration on the BugFix gym, from the agent
                experiment's weak base, at equal sampling budget                   C4 (extension)

What to expect (`trajtune run iw_sft_bandit`, ~15 CPU-s; `trajtune run iw_sft_bugfix`, ~100 CPU-s):

    C1   SFT on filtered data: pi(right) 2/3, reward 5/6 (closed form; the test's tolerance 0.02)
    C2   clip (0.2, 1.8): pi(right) -> 18/19 = 0.947, reward 0.974; smooth alpha 0.5: pi(right) 0.8
    C3   the most peaked weights against plain SFT: does NOT hold at this budget. With 8 samples a
         round plain SFT's final pi(right) already spreads (sd 0.19, 19% of runs on the wrong arm);
         alpha 2 spreads about as much (0.22, 5%); a moderate alpha 1 narrows it (0.04, 0%) and
         clipping keeps it at 0.13: too-peaked weights raise the spread over the best alpha, not
         over SFT's (seed 0)
    C4   iw-SFT against plain expert iteration at equal budget, over seeds (`--seeds 0,1,2`); the
         report says what the paper's bound predicts here (little: pi_ref is re-set every round)

How they depart from the paper, and why:

    1. Bandit: the policy is two logits fitted by SGD on the shipped losses (`objectives.sft`,
       `objectives.importance`), warm-started across rounds; q is the policy at the start of the
       round (the paper's time-lagged copy, eq. 10), so round 1 is plain SFT.
    2. C3 is shown with little data (8 samples a round, 200 batched runs): with the paper's
       20,000 samples and an always-paying right arm, peaked weights only help; with few samples
       q's own noise feeds back through (q / pi_ref)^alpha, which is the failure mode the paper warns of.
    3. BugFix (C4) is not in the paper: pi_ref is the policy that sampled the round (expert iteration's
       data), not a fixed reference, and the kept set is the 0/1 hidden-test filter of A5.
"""
