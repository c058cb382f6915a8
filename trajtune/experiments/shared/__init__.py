"""What the recipes on chapter 13's tiny models share (chapter13, graders, rlhf_book): the one module an experiment
may import from another experiment's domain (`tests/unit/test_layout.py`); everything else an experiment needs is the
library's.

    instruct.py     the char-level instruct policy: corpus, renderer, demonstrations, `pretrain` and `sft_*` stages
    preference.py   the preference pairs as conversations, the narrow SFT model, the reward-at-KL evaluation
    calculator.py   the calculator: the arithmetic gym's source, worked demonstrations, `math_eval`, `coldstart`
    recipe.py       the seed's optimizer, the upstream settings and stages, the runner and the report's pieces
"""
