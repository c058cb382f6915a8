"""Pure loss functions: tensors in, `(loss, metrics)` out (DESIGN.md, "Pieces").

    sft              weighted_nll, weighted_sft_loss, sft_loss          (the one idea)
    advantages       group_advantages (REINFORCE/RLOO/GRPO/Dr.GRPO), gae, whiten, ...
    policy_gradient  policy_gradient_loss (PG/PPO/GSPO/CISPO, a mismatch correction, KL, entropy), value_loss
    corrections      correction_weights: TIS (token, sequence), MIS masks, IcePop, decoupled PPO's behaviour weight
    inputs           PGInputs (the policy-gradient loss's step tensors), PGOptions (its settings),
                     PreferenceInputs (the preference losses' step tensors)
    kl               kl_estimate (k1/k2/k3), kl_penalized_rewards, kl_loss, full_kl
    reward_model     bradley_terry_loss, plackett_luce_loss, orm_loss, prm_loss
    preference       dpo_loss (DPO/cDPO/IPO/RPO), simpo_loss, orpo_loss, kto_loss
    importance       iw_sft_weights, iw_sft_loss                         (iw-SFT §3.4)
    distill          distill_advantages, reverse_kl_loss                 (book ch.12)

(`_checks.py`: the shape checks the losses share, private.) Import from the submodules, e.g.
`from trajtune.objectives.preference import dpo_loss`.
"""
