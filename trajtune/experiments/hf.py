"""Recipe entry for Hugging Face models: `experiment = "hf"`, `[config]` = `trajtune.hf_cli.HFConfig` fields.

    trajtune run trajtune/recipes/hf_sft.toml --set config.model=./my-model --set config.data=chats.jsonl

runs exactly what `trajtune sft --model ./my-model --data chats.jsonl` runs; the
recipe's run directory replaces `out`.
"""

from __future__ import annotations

from pathlib import Path

from ..hf_cli import HFConfig, run_hf

Config = HFConfig


def run(config: HFConfig, run_dir: Path) -> Path:
    """Train, save model/ in the Hugging Face format, and return a one-page report."""
    from ..metrics import read_metrics

    model_dir = run_hf(config, run_dir)
    rows = read_metrics(run_dir)
    last = rows[-1] if rows else {}
    shown = {k: v for k, v in last.items() if k not in ("time", "stage")}
    report = Path(run_dir) / "report.md"
    report.write_text(f"# {config.command} on {config.model}\n\nmodel: `{model_dir}`\n\nlast logged row: `{shown}`\n")
    return report
