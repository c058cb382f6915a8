"""`trajtune view RUN_DIR`: a static HTML page of the episodes a run recorded, token by token.

    trajtune view runs/agent-20261201-1200                  # -> runs/agent-20261201-1200/view.html
    trajtune view RUN_DIR --steps 1,50 --stage rl --out /tmp/v.html

`write_view` writes the page: `trajtune view` (trajtune/cli/view.py) calls it, and so does a recipe before its
report, which then links the page (the agent recipe). It reads every RUN_DIR/<stage>/episodes.jsonl (written while
training: trajtune/runs/recorder.py) and writes one self-contained page (inline CSS and JS, no server, no network): per
episode its stage, step, task, the answer its data expects (info["expected"], where the row has one), reward, why it
stopped (a "length" badge when the reply was cut at the token budget), flags (hacked: passed the
public checks, not the hidden ones; failed: the environment raised), the whole `info`, and every
token coloured by its owner (template, prompt, policy, tool); a token is never split across lines.
Hovering a token shows, and a table per episode lists for every policy token, its log-prob under the
sampler and under the trainer, its advantage and the importance ratio exp(trainer - sampler).
Filters at the top: stage, step, task (substring), reward range, stop reason, hacked, failed.

Policy versions: in a run whose episodes carry them (the rows' "versions": a source that samples behind the trainer
stamped them, `Trajectory.versions`), every policy token is coloured by the version that sampled it, as how many
updates behind the step that trained it (row step n was trained by the weights after n - 1 updates: k = n - 1 - v;
green is 0, on-policy), a legend and a switch back to the owner colours at the top; its tooltip and the side table
say "version v (k behind the step that trained it)", its head which versions sampled it, and an episode whose
policy tokens carry several versions (a partial rollout, continued under newer weights) has a "resumed" badge.
Runs without versions get the page as before.

Token text comes from the tokenizer of the policy that sampled the episode, stage by stage
(`runs.decoders.stage_decoders`: the tokenizer files, the stage graph, the incremental decoding of
characters split across tokens are described there); the page warns where that tokenizer is a guess.

Whitespace is kept as the tokens carry it (a token of spaces or a line break is shown as such, so
code keeps its indentation). The word-level tokenizer carries none: its tokens are words,
punctuation runs and line breaks, `decode` joins them with single spaces, and the policy never
sees the indentation of the code it reads; the page says so.
"""

from __future__ import annotations

import html
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from ..config import ConfigError
from .decoders import Decoder, stage_decoders
from .recorder import FILE, read_episodes
from ..trajectory import Owner

OWNER_NAMES = {int(o): o.name.lower() for o in Owner}


# --- finding what the page shows -------------------------------------------------------------
def find_episodes(run_dir: Path) -> list[Path]:
    """Every episodes.jsonl of a run (RUN_DIR itself may be one file)."""
    if run_dir.is_file():
        return [run_dir]
    if not run_dir.is_dir():
        raise ConfigError(f"trajtune view: no run directory {run_dir}")
    found = sorted(run_dir.rglob(FILE))
    stages = [] if found else run_stages(run_dir)
    kinds = list(dict.fromkeys(NO_EPISODES.get(s.split("_")[0].split("-")[0]) for s in stages))
    if kinds and None not in kinds:
        what = " and ".join(kinds)
        raise ConfigError(f"trajtune view: {run_dir} is a run of {what} (stage{'s' * (len(stages) > 1)} "
                          f"{', '.join(stages)}), and {what} sample{'s' * (len(kinds) == 1)} no episodes: "
                          f"{'they train' if len(kinds) > 1 else 'it trains'} on the data's own replies, so there is "
                          "nothing to view (the RL and RFT stages, "
                          "e.g. `trajtune grpo` and `trajtune rft`, record the episodes this page shows)")
    if not found:
        raise ConfigError(f"trajtune view: {run_dir} has no {FILE} (the RL / RFT stages of a run record a few "
                          "episodes as they train; was this run made before recording existed, or did it not train?)")
    return found


NO_EPISODES = {"sft": "SFT", "pretrain": "pretraining", "dpo": "DPO", "ipo": "IPO", "simpo": "SimPO", "orpo": "ORPO",
               "kto": "KTO", "rm": "reward-model training", "reward": "reward-model training"}
"""stage kinds (the first word of a stage's name) that train on the data's replies and sample nothing"""


def run_stages(run_dir: Path) -> list[str]:
    """The stages of a run: its metrics.jsonl rows' "stage" values, else its stage directories (results.json)."""
    stages: dict[str, None] = {}
    try:
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("stage"), str):
                stages.setdefault(row["stage"], None)
    except OSError:
        pass
    if not stages:
        stages = dict.fromkeys(d.name for d in sorted(run_dir.iterdir()) if (d / "results.json").is_file())
    return list(stages)



def flags(row: dict) -> dict[str, bool]:
    """hacked: the public checks passed and the hidden ones did not (or info says so); failed: the environment or the
    reward failed (the episode's outcome, or info["env_error"] in rows recorded before outcomes)."""
    info = row.get("info") or {}
    hacked = bool(info.get("hacked")) or (bool(info.get("public_pass")) and info.get("hidden_pass") is False)
    failed = row.get("outcome", "ok") != "ok" or "env_error" in info or info.get("stop_reason") == "env_error"
    return {"hacked": hacked, "failed": failed}


def stop_reason(row: dict) -> str:
    """Why the episode ended (info["stop_reason"]: trajtune/sources/rollout.py). "length": the reply that ended it was
    cut at the token budget; rows recorded before the rollout said so read "done" with every turn unterminated."""
    info = row.get("info") or {}
    stop = str(info.get("stop_reason", ""))
    turns, cut = info.get("n_turns"), info.get("n_unterminated")
    if stop == "done" and isinstance(turns, int) and turns > 0 and cut == turns:
        return "length"
    return stop


def expected(row: dict) -> Any:
    """The answer the task's data expects (info["expected"]; an env's info["answer"] in older rows), or None."""
    info = row.get("info") or {}
    return info.get("expected", info.get("answer"))


# --- the page ---------------------------------------------------------------------------------
LAGS = 5
"""updates behind with a colour of their own: 0 .. LAGS - 1; LAGS and more share the last (shown "5+")"""


def version_of(row: dict, i: int) -> tuple[int, int] | None:
    """Token i's (version v, k: how many updates behind the step that trained it) in a row with versions; the row of
    step n was trained by the weights after n - 1 updates, so k = n - 1 - v. None where the token has none (-1)."""
    v = row["versions"][i]
    return None if v < 0 else (v, row.get("step", 1) - 1 - v)


def lag_class(row: dict, i: int) -> str:
    """The CSS class of policy token i of a row with versions: lag<k>, k updates behind (`version_of`); lagx: none."""
    vk = version_of(row, i)
    return "lagx" if vk is None else f"lag{min(max(vk[1], 0), LAGS)}"


def token_stats(row: dict, i: int) -> dict[str, float]:
    s, t, a = row["sampler_logp"][i], row["trainer_logp"][i], row["advantage"][i]
    return {"sampler": s, "trainer": t, "advantage": a, "ratio": math.exp(t - s)}


def _show(x: Any) -> str:
    return x if isinstance(x, str) else json.dumps(x, default=str)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else str(x)


def render_episode(row: dict, decoder: Decoder | None) -> str:
    f = flags(row)
    info = row.get("info") or {}
    reward = row.get("reward")
    reward_num = reward if isinstance(reward, (int, float)) else float("nan")
    stop, want = stop_reason(row), expected(row)
    attrs = {"stage": row.get("stage", ""), "step": row.get("step", 0), "task": row.get("task", ""),
             "reward": reward_num, "stop": stop, "hacked": int(f["hacked"]), "failed": int(f["failed"])}
    data = " ".join(f'data-{k}="{html.escape(str(v), quote=True)}"' for k, v in attrs.items())
    texts, completed_by = decoder.texts(row["ids"]) if decoder is not None else ([f"#{i}" for i in row["ids"]],
                                                                                 [None] * len(row["ids"]))
    tokens, table = [], []
    versioned = row.get("versions") is not None
    for i, (tid, owner) in enumerate(zip(row["ids"], row["owners"], strict=True)):
        text, whole = texts[i], completed_by[i]
        name = OWNER_NAMES.get(owner, str(owner))
        cls = f"t {name}" + (" nl" if "\n" in text else "")  # a line break inside: laid out inline
        tip = f"{name} · id {tid} · turn {row['turns'][i]}"
        if whole is not None:  # the first bytes of a character: the token that completes it shows it whole
            cls += " part"
            tip += f" · the first bytes of a character that token {whole} completes (shown there whole)"
        if owner == Owner.POLICY:
            st = token_stats(row, i)
            tip += (f" · sampler logp {_fmt(st['sampler'])} · trainer logp {_fmt(st['trainer'])}"
                    f" · advantage {_fmt(st['advantage'])} · ratio {_fmt(st['ratio'])}")
            if abs(math.log(max(st["ratio"], 1e-30))) > math.log(1.25):
                cls += " off"  # sampler and trainer disagree: ratio outside [0.8, 1.25]
            shown = repr(text) if whole is None else f"(first bytes of the character of token {whole})"
            version = ""
            if versioned:
                vk = version_of(row, i)
                version = "unknown" if vk is None else f"version {vk[0]} ({vk[1]} behind the step that trained it)"
                cls += " " + lag_class(row, i)
                tip += f" · {version}"
                version = f"<td>{html.escape(version)}</td>"
            table.append(f"<tr><td>{i}</td><td class='tx'>{html.escape(shown)}</td><td>{_fmt(st['sampler'])}</td>"
                         f"<td>{_fmt(st['trainer'])}</td><td>{_fmt(st['advantage'])}</td>"
                         f"<td>{_fmt(st['ratio'])}</td>{version}</tr>")
        tokens.append(f'<span class="{cls}" title="{html.escape(tip, quote=True)}">{html.escape(text)}</span>')
    badges = "".join(f'<span class="badge {k}">{k}</span>' for k, v in f.items() if v)
    if stop == "length":
        badges = ('<span class="badge length" title="the reply used up the token budget (max new tokens) before its '
                  'stop token: cut, not finished">length: cut at the token budget</span>') + badges
    if row.get("kept") is not None:
        badges += f'<span class="badge kept">{"kept" if row["kept"] else "not kept"}</span>'
    sampled = ""
    if versioned:  # the versions of its policy tokens, k behind the step that trained it (`version_of`)
        sampled_by = sorted({v for v, o in zip(row["versions"], row["owners"], strict=True)
                             if o == Owner.POLICY and v >= 0})
        if sampled_by:
            sampled = (f" · sampled by version{'s' * (len(sampled_by) > 1)} "
                       + ", ".join(f"{v} ({row.get('step', 1) - 1 - v} behind)" for v in sampled_by))
        if len(sampled_by) > 1:
            badges += ('<span class="badge resumed" title="a partial rollout: interrupted at a weight update and '
                       f'continued under newer weights (policy versions {", ".join(map(str, sampled_by))})">'
                       'resumed</span>')
    head = (f"<b>{html.escape(str(row.get('stage', '')))}</b> step {row.get('step')} · episode {row.get('index')} · "
            f"group {row.get('group')} · task <code>{html.escape(str(row.get('task', '')))}</code>"
            + ("" if want is None else f" · expected <code class='expected'>{html.escape(_show(want))}</code>")
            + " · reward "
            "<b class='reward'>"
            f"{html.escape(_fmt(reward_num) if isinstance(reward, (int, float)) else str(reward))}</b>"
            f"{sampled} · stop {html.escape(stop)} {badges}")
    return (f'<section class="episode" {data}><div class="head">{head}</div>'
            f'<div class="tokens">{"".join(tokens)}</div>'
            f'<details><summary>policy tokens ({len(table)})</summary><table class="side"><tr><th>#</th><th>token</th>'
            f'<th>sampler logp</th><th>trainer logp</th><th>advantage</th><th>ratio</th>'
            f'{"<th>version</th>" if versioned else ""}</tr>{"".join(table)}</table>'
            f'</details><details><summary>info</summary><pre>{html.escape(json.dumps(info, indent=1, default=str))}'
            f'</pre></details></section>')


CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 16px;z-index:2}
header h1{font-size:17px;margin:0 0 6px;overflow-wrap:anywhere}
.filters label{margin-right:12px;white-space:nowrap;display:inline-block}.filters input{width:7em}
.legend span{margin-right:10px}
main{padding:8px 16px;max-width:100%}
.episode{background:#fff;border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:8px 10px;overflow-wrap:anywhere}
.head{margin-bottom:6px}
.tokens{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap;tab-size:4;overflow-x:auto}
.t{border-radius:3px;padding:1px 1px;margin:0 2px 0 0;display:inline-block;white-space:pre;word-break:keep-all;\
overflow-wrap:normal}
.t.nl{display:inline}
.t.part{min-width:.5em}.t.part::before{font-size:.75em;content:"\\2026";color:#888}
.template{background:#e4e4e4;color:#777}.prompt{background:#dbe8ff}.policy{background:#c9f2c9}.tool{background:#ffe2bf}
.t.off{outline:2px solid #d33}
.badge{font-size:11px;border-radius:8px;padding:1px 7px;margin-left:6px;color:#fff;display:inline-block;\
white-space:nowrap}
.badge.hacked{background:#c2185b}.badge.failed{background:#b71c1c}.badge.kept{background:#555}
.badge.length{background:#e65100}code.expected{background:#fff3c4;padding:0 4px}
details{max-width:100%;overflow-x:auto}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
table.side{border-collapse:collapse;font-size:12px;margin:4px 0}
table.side td,table.side th{border:1px solid #ddd;padding:1px 6px;text-align:right;white-space:nowrap;\
overflow-wrap:normal}
td.tx{text-align:left;font-family:ui-monospace,monospace;white-space:pre-wrap}
.warn{background:#fff3e0;border:1px solid #e65100;border-radius:6px;padding:6px 10px;margin:8px 0}
.tokenizers ul{margin:4px 0}
#panel{font:12px ui-monospace,monospace;color:#333;min-height:1.4em;overflow-wrap:anywhere}
"""


JS = """
const eps=[...document.querySelectorAll('.episode')];
function val(id){return document.getElementById(id).value}
function apply(){
  const st=val('f-stage'),sp=val('f-step'),task=val('f-task').toLowerCase(),lo=parseFloat(val('f-rmin')),
        hi=parseFloat(val('f-rmax')),so=val('f-stop'),hk=val('f-hacked'),fl=val('f-failed');let n=0;
  for(const e of eps){const d=e.dataset,r=parseFloat(d.reward);
    const ok=(st===''||d.stage===st)&&(sp===''||d.step===sp)&&(task===''||d.task.toLowerCase().includes(task))
      &&(isNaN(lo)||r>=lo)&&(isNaN(hi)||r<=hi)&&(so===''||d.stop===so)&&(hk===''||d.hacked===hk)
      &&(fl===''||d.failed===fl);
    e.style.display=ok?'':'none';n+=ok;}
  document.getElementById('count').textContent=n+' of '+eps.length+' episodes';}
document.querySelectorAll('.filters input,.filters select').forEach(x=>x.addEventListener('input',apply));
document.addEventListener('mouseover',ev=>{if(ev.target.classList.contains('t'))
  document.getElementById('panel').textContent=ev.target.title;});
apply();
"""

VERSION_CSS = """
.badge.resumed{background:#6a1b9a}.versions label{margin-left:6px}
.by-version .t.policy.lag0{background:#c9f2c9}.by-version .t.policy.lag1{background:#fff176}
.by-version .t.policy.lag2{background:#ffb74d}.by-version .t.policy.lag3{background:#f48fb1}
.by-version .t.policy.lag4{background:#ce93d8}.by-version .t.policy.lag5{background:#90a4ae}
.by-version .t.policy.lagx{background:#fff;border:1px dashed #888}
"""
"""the version colours (pages of runs with versions only): lag<k>, k updates behind; lagx, no version"""

VERSION_JS = """
document.getElementById('f-versions').addEventListener('input',ev=>
  document.body.classList.toggle('by-version',ev.target.checked));
"""


def version_legend(rows: list[dict]) -> str:
    """The legend of the version colours, for the lags the rows hold, with the switch back to owner colours."""
    lags = {lag_class(r, i) for r in rows if r.get("versions") is not None
            for i, o in enumerate(r["owners"]) if o == Owner.POLICY}
    names = {**{f"lag{k}": str(k) for k in range(LAGS)}, f"lag{LAGS}": f"{LAGS}+", "lagx": "unknown"}
    names["lag0"] = "0 (on-policy)"
    swatches = "".join(f'<span class="t policy {c}">{names[c]}</span>' for c in names if c in lags)
    return (f'<div class="legend versions">policy tokens by the version that sampled them, updates behind the step '
            f'that trained them: {swatches}<label><input type="checkbox" id="f-versions" checked> colour by version'
            '</label></div>')


def _options(values: Sequence[Any]) -> str:
    return '<option value="">all</option>' + "".join(
        f'<option value="{html.escape(str(v), quote=True)}">{html.escape(str(v))}</option>' for v in values)


def render_page(rows: list[dict], decoders: Decoder | None | dict[str, tuple[Decoder | None, str, bool]], title: str,
                warnings: Sequence[str] = ()) -> str:
    """The whole page: filters, a legend, which tokenizer decodes each stage, `warnings`, one section per episode
    (rows in the order given). `decoders`: one decoder, or {stage: (decoder, where it came from, guessed)}
    (`stage_decoders`: stages of a run may use different tokenizers)."""
    per_stage = decoders if isinstance(decoders, dict) else {}
    stages = list(dict.fromkeys(str(r.get("stage", "")) for r in rows))
    steps = sorted({r.get("step", 0) for r in rows})
    stops = sorted({s for s in map(stop_reason, rows) if s})
    legend = "".join(f'<span class="t {n}">{n}</span>' for n in OWNER_NAMES.values())
    versioned = any(r.get("versions") is not None for r in rows)
    yes_no = '<option value="">any</option><option value="1">yes</option><option value="0">no</option>'
    filters = (f'<label>stage <select id="f-stage">{_options(stages)}</select></label>'
               f'<label>step <select id="f-step">{_options(steps)}</select></label>'
               '<label>task <input id="f-task" placeholder="contains"></label>'
               '<label>reward &ge; <input id="f-rmin" type="number" step="any"></label>'
               '<label>reward &le; <input id="f-rmax" type="number" step="any"></label>'
               f'<label>stop <select id="f-stop">{_options(stops)}</select></label>'
               f'<label>hacked <select id="f-hacked">{yes_no}</select></label>'
               f'<label>failed <select id="f-failed">{yes_no}</select></label><span id="count"></span>')
    body = "".join(render_episode(r, per_stage.get(r.get("stage"), (None,))[0] if per_stage else decoders)
                   for r in rows)
    where = "".join(f"<li>{html.escape(str(s))}: {html.escape(note)}"
                    + (" &mdash; word-level: its tokens hold no spaces or indentation (decode joins them with one "
                       "space), so neither does the page" if d is not None and d.word_level else "") + "</li>"
                    for s, (d, note, _) in per_stage.items())
    split = (' · <span class="t part"></span> the first bytes of a character that a later token completes (shown '
             'there whole)' if re.search(r'class="t [^"]*\bpart\b', body) else "")
    notes = (f'<details class="tokenizers"><summary>tokenizers: which decodes each stage</summary><ul>{where}</ul>'
             '</details>' if where else "")
    notes += "".join(f'<p class="warn">warning: {html.escape(w)}</p>' for w in warnings)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f'<style>{CSS}{VERSION_CSS if versioned else ""}</style></head>'
            f'<body{" class=by-version" if versioned else ""}><header><h1>{html.escape(title)}</h1>'
            f'<div class="filters">{filters}</div><div class="legend">owners: {legend} · red outline: importance '
            f'ratio outside [0.8, 1.25] · <span class="badge length">length</span> the reply was cut at the token '
            f'budget, not finished{split}</div>{version_legend(rows) if versioned else ""}'
            f'<div id="panel">hover a token for its numbers</div></header>'
            f'<main>{notes}{body}</main><script>{JS}{VERSION_JS if versioned else ""}</script></body></html>')


def tokenizer_warnings(rows: list[dict], decoders: dict[str, tuple[Decoder | None, str, bool]]) -> list[str]:
    """What the reader must know about the decoding, stage by stage: a tokenizer guessed, ids outside its vocabulary,
    no tokenizer at all."""
    out = []
    for stage, (decoder, where, guessed) in decoders.items():
        ids = [r["ids"] for r in rows if r.get("stage") == stage]
        if decoder is None:
            out.append(f"stage {stage}: no tokenizer found, tokens show as their ids (pass --tokenizer PATH)")
            continue
        bad = [decoder.outside(x) for x in ids]
        if sum(bad):
            out.append(f"stage {stage}: {sum(bad)} of {sum(map(len, ids))} token ids (in {sum(b > 0 for b in bad)} of "
                       f"{len(ids)} episodes) fall outside the vocabulary of its tokenizer ({decoder.source}, "
                       f"{decoder.size} tokens): decoded by another model's tokenizer? (--tokenizer PATH sets it)")
        elif guessed:
            out.append(f"stage {stage}: decoded with {where}")
    return out


def run_order(run_dir: Path, stages: Sequence[str]) -> list[str]:
    """`stages` in the order the run ran them (their first metric rows; `run_stages`), the others after, as given."""
    ran = run_stages(run_dir) if run_dir.is_dir() else []
    return [s for s in ran if s in stages] + [s for s in stages if s not in ran]


def write_view(run_dir: str | Path, out: str | Path | None = None, steps: Sequence[int] | None = None,
               stages: Sequence[str] | None = None, tokenizer: str | None = None) -> Path:
    """Write the page for a run -> its path (default RUN_DIR/view.html); its warnings go to stderr as well."""
    run_dir = Path(run_dir)
    try:
        rows = [r for f in find_episodes(run_dir) for r in read_episodes(f)]
    except ConfigError:
        raise
    except ValueError as e:  # a broken line: named by read_episodes
        raise ConfigError(f"trajtune view: {e}") from None
    if steps:
        rows = [r for r in rows if r.get("step") in set(steps)]
    if stages:
        rows = [r for r in rows if r.get("stage") in set(stages)]
    if not rows:
        raise ConfigError(f"trajtune view: no recorded episode of {run_dir} matches "
                          f"(steps {list(steps or []) or 'any'}, stages {list(stages or []) or 'any'})")
    order = {s: i for i, s in enumerate(run_order(run_dir, list(dict.fromkeys(r.get("stage") for r in rows))))}
    rows.sort(key=lambda r: (order[r.get("stage")], r.get("step", 0), r.get("index", 0)))
    ids: dict[str, list[list[int]]] = {}
    for r in rows:
        ids.setdefault(str(r.get("stage")), []).append(r["ids"])
    decoders = stage_decoders(run_dir, [str(s) for s in order], tokenizer, ids)
    warnings = tokenizer_warnings(rows, decoders)
    for w in warnings:
        print(f"trajtune view: warning: {w}", file=sys.stderr)
    out = Path(out) if out else (run_dir.parent if run_dir.is_file() else run_dir) / "view.html"
    out.write_text(render_page(rows, decoders, f"trajtune view: {run_dir}", warnings), encoding="utf-8")
    return out


def write_view_if_recorded(run_dir: str | Path) -> Path | None:
    """`write_view(run_dir)` when the run recorded episodes (a recipe calls it before writing its report, which then
    links view.html); None when it recorded none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(run_dir.rglob(FILE)):
        return None
    return write_view(run_dir)
