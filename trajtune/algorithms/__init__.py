"""The training loops: one per algorithm, each on the template of `trajtune.runs.loop`.

    sft.py             supervised fine-tuning: weight 1 on every POLICY token
    rl.py              REINFORCE, RLOO, GRPO, Dr. GRPO, PPO, GSPO, CISPO, TOPR; KL control, DAPO's knobs, PPO-ptx
    reference.py       the RL loop's KL reference (the frozen starting policy: resident, LoRA base, on disk); RL's razor
    kto.py             KTO on unpaired (prompt, completion, label) rows
    rft.py             rejection-sampling fine-tuning / expert iteration
    iw_sft.py          importance-weighted SFT with a lagged q
    dpo.py             DPO and its relatives: offline, on regenerated pairs, or online
    reward_model.py    reward models: Bradley-Terry, ranked lists, ORM and PRM
    distill.py         on-policy distillation, self-distillation, sequence-level KD
    ai_feedback.py     AI feedback: RLAIF labels, Constitutional AI, ratings -> pairs
    best_of_n.py       best-of-N sampling with a scorer
    common.py          what the loops share: rollout statistics, selection, train rows

A loop sees a source only through `trajtune.sources.base` and the engine only through `trajtune.engine`.
"""
