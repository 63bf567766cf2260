"""The report's defects of issue 37, one test each: one model name; every finding code explained;
the device's attention kernel, not the CPU's the measurement ran; one name per number; and the
Inspector's header card (``display.header_card``, the same dict in both)."""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import shardviz as sv
from shardviz.views import display
from shardviz import zoo
from shardviz.finding import TITLES
from shardviz.format import COLUMNS
from shardviz.report import render_report
from shardviz.widget import panels

ROOT = Path(__file__).resolve().parents[1]
MESH = sv.Mesh(shard=4, device="H100")
TRAINING = sv.Training(batch_size=1, seq_len=64)


@functools.lru_cache(maxsize=None)
def model():
    return zoo.tiny_llama_lora()


@functools.lru_cache(maxsize=None)
def report(lora: str = "ignored", param_dtype: str = "bfloat16") -> str:
    m = model()
    plans = {f"LoRA {x}": sv.Plan.auto(m, lora=x) for x in ("ignored", "sharded")}
    training = sv.Training(batch_size=1, seq_len=64, param_dtype=param_dtype)
    return render_report(m, plans[f"LoRA {lora}"], MESH, training, compare_with=plans)


def text_of(page: str) -> str:
    """What a reader sees: no scripts (the chart payloads, the code's JSON), no tags."""
    page = re.sub(r"<script.*?</script>", " ", page, flags=re.S)
    page = re.sub(r"<style.*?</style>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def test_the_report_names_the_model_once_by_one_name():
    """It said "LlamaForCausalLM (...)" in the title, then "PeftModelForCausalLM on ..." one line on."""
    head = text_of(report()).split("Findings")[0]
    classes = set(re.findall(r"\b\w+(?:ForCausalLM|Model)\b", head))
    assert classes == {"LlamaForCausalLM"}, classes
    # the whole page, the step time's notes included ("the stack a PeftModelForCausalLM most likely trains with")
    assert "PeftModelForCausalLM" not in text_of(report())


def test_every_code_the_sources_emit_has_a_title():
    codes = set()
    for path in (ROOT / "shardviz").rglob("*.py"):
        codes |= set(re.findall(r'"(SV\d{3})"', path.read_text()))
    assert codes and not codes - set(TITLES), sorted(codes - set(TITLES))


def test_every_code_in_the_report_is_explained():
    """SV102 (LoRA ignored) is shown in the findings and in the layouts compared: each with its title."""
    text = text_of(report())
    codes = set(re.findall(r"\bSV\d{3}\b", text))
    assert "SV102" in codes
    for code in codes:
        assert TITLES[code] in text, code
    assert "Finding codes" in text
    # the Inspector's findings carry the same titles
    a = sv.analyze(model(), sv.Plan.auto(model(), lora="ignored"), MESH, TRAINING, strict=False)
    assert {f["code"]: f["title"] for f in panels.findings_payload(a)}["SV102"] == TITLES["SV102"]


def test_the_attention_kernel_is_the_gpus():
    """An H100 report named the CPU kernel the measurement ran (_scaled_dot_product_flash_attention_for_cpu)."""
    text = text_of(report())
    assert "_for_cpu" not in text
    assert "flash attention (aten._scaled_dot_product_flash_attention) in bfloat16" in text
    # in float32 the GPU's flash kernel refuses the dtype: the memory-efficient one runs
    fp32 = text_of(report(param_dtype="float32"))
    assert "memory-efficient attention (aten._scaled_dot_product_efficient_attention) in float32" in fp32


def test_one_name_per_number():
    """The bytes every collective moves in a step were "size per step", "moved per step" and
    "collective bytes per step" on three surfaces: now format.COLUMNS' one name everywhere."""
    name = COLUMNS["bytes_per_step"][0]
    text = text_of(report())
    assert "size per step" not in text and "collective bytes per step" not in text
    assert text.count(name) >= 2  # the traffic totals and the layouts compared
    assert [label for key, label, *_ in panels.COMPARISON_ROWS if key == "bytes_per_step"] == [name]
    # the traffic chart (charts.js, inlined in the report and drawn by the Inspector) says it so too
    charts = (ROOT / "shardviz" / "widget" / "charts.js").read_text()
    assert "collective buffers" not in charts and "moved per step" in charts


def test_the_report_opens_with_the_inspectors_header_card():
    m = model()
    plan = sv.Plan.auto(m, lora="ignored")
    a = sv.analyze(m, plan, MESH, TRAINING, strict=False)
    card = display.header_card(a, a.findings)
    page = render_report(m, plan, MESH, TRAINING, analysis=a)
    assert '<div class="card">' in page
    top = text_of(page.split('<div class="card">', 1)[1].split('<p class="step">', 1)[0])
    assert card["verdict_word"] in top and card["step_text"] in top
    assert card["tokens_text"] in top and card["mfu_text"] in top
    assert card["finding"]["code"] == "SV102" and card["finding"]["applies"]  # its fix is a plan change
    assert f"SV102 ({TITLES['SV102']}):" in top
    # the top finding by its first clause, as the Inspector's card (issue 37: 60-word paragraphs); all of it on hover
    assert card["finding"]["headline"] in top and len(card["finding"]["headline"]) <= display.HEADLINE_CHARS
    assert f'title="{html.escape(card["finding"]["message"])}"' in page
    assert 'class="card-bar"' in page
    # the Inspector's summary carries the very same card
    from shardviz.widget import Inspector

    ins = Inspector(m, plan=plan, mesh=MESH, training=TRAINING)
    assert ins.summary["card"] == card
    assert a.step.step_time_s == card["step_time_s"] and a.fit.verdict == card["verdict"]


def test_a_findings_headline_is_its_first_clause_cut_at_a_word():
    """``display.first_clause``: to the first ". " or "; " outside parentheses, then at most 160
    characters, cut at a word with "…" (the card's line in the Inspector and the report)."""
    clause = display.first_clause
    assert clause("does not fit: 6 MiB over (device_memory 1 MiB; 5 % margin); largest: x") == \
        "does not fit: 6 MiB over (device_memory 1 MiB; 5 % margin);"
    assert clause("ignored LoRA gradients are not all-reduced. Fix: shard them") == \
        "ignored LoRA gradients are not all-reduced."
    assert clause("a. b; c") == "a. b; c"  # no cut in the first 20 characters
    long = "word " * 60
    out = clause(long)
    assert len(out) <= 160 and out.endswith("…") and long.startswith(out[:-1]) and not out[:-1].endswith(" ")


def test_the_card_says_sv201s_cheapest_fix_once():
    """The card's line became SV201's cheapest fix ("fix: checkpoint every block: fits, ..."), and the
    report still appended the whole fix after it: the same fix twice in one line. The whole text stays
    in the findings below."""
    m = zoo.build("llama3_8b", lora=True)
    page = render_report(m, sv.Plan.auto(m), sv.Mesh(shard=8, device="A100-40GB"),
                         sv.Training(batch_size=2, seq_len=8192))
    card = re.search(r'<p class="card-finding[^"]*"[^>]*>(.*?)</p>', page, re.S).group(1)
    finding = next(f for f in sv.analyze(m, sv.Plan.auto(m), sv.Mesh(shard=8, device="A100-40GB"),
                                         training=sv.Training(batch_size=2, seq_len=8192)).findings if f.code == "SV201")
    assert html.escape(f"fix: {finding.change.words}") in card
    assert "cheapest fix" not in card
    assert html.escape(finding.fix) in page  # the findings below keep the whole text
