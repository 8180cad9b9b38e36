"""Hugging Face config.json import: published parameter counts by formula, identity with the zoo, errors, CLI.

The configs under tests/data/hf/ are the published ones (see the README there). Every expected
number below is either a closed-form formula over the config's own fields or a parameter count
the model's publisher / Hugging Face reports (`model.num_parameters()`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import trainsim
from trainsim.errors import ConfigError
from trainsim.workload.hf import READERS, build_hf_model, hf_transformer_config, load_hf_config
from trainsim.workload.ir import CONTRACTION_KINDS, Model
from trainsim.workload.zoo import build_model
from trainsim.workload.zoo.transformer import build_transformer

HF = Path(__file__).parent / "data" / "hf"


def cfg_json(name: str) -> dict[str, Any]:
    return json.loads((HF / name).read_text())


def write(tmp_path: Path, data: Any, name: str = "config.json") -> Path:
    p = tmp_path / name
    if isinstance(data, str):
        p.write_bytes(data.encode("utf-8", "surrogateescape"))  # "\udcff": a stray 0xff byte
    else:
        p.write_text(json.dumps(data))
    return p


# ---- closed-form parameter counts over a config's own fields --------------------------------------------


def llama_params(c: dict[str, Any]) -> int:
    """RMSNorm x2 per layer, q/k/v/o (+ q/k/v biases for Qwen2), SwiGLU (x experts + router), untied head."""
    L, h, a, f, v = (c[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                    "intermediate_size", "vocab_size"))
    g = c.get("num_key_value_heads") or a
    d = c.get("head_dim") or h // a
    qkv = h * (a + 2 * g) * d + ((a + 2 * g) * d if c["model_type"] == "qwen2" else 0)
    e = c.get("num_local_experts", 0)
    mlp = 3 * h * f * e + h * e if e else 3 * h * f
    return L * (qkv + a * d * h + mlp + 2 * h) + v * h * (1 if c.get("tie_word_embeddings") else 2) + h


def gpt_block_params(h: int, f: int) -> int:
    """LayerNorm x2, fused qkv, proj, fc1, fc2, all with biases (12 h^2 + 13 h when f = 4h)."""
    return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)


def gpt2_params(c: dict[str, Any]) -> int:
    h = c["n_embd"]
    return (c["n_layer"] * gpt_block_params(h, c.get("n_inner") or 4 * h) + c["vocab_size"] * h
            + c["n_positions"] * h + 2 * h)


def neox_params(c: dict[str, Any]) -> int:
    h = c["hidden_size"]
    return c["num_hidden_layers"] * gpt_block_params(h, c["intermediate_size"]) + 2 * c["vocab_size"] * h + 2 * h


def bert_model_params(c: dict[str, Any]) -> int:
    """BertModel: word + position + token-type embeddings, embedding LayerNorm, blocks, pooler."""
    h = c["hidden_size"]
    emb = (c["vocab_size"] + c["max_position_embeddings"] + c["type_vocab_size"]) * h + 2 * h
    return emb + c["num_hidden_layers"] * gpt_block_params(h, c["intermediate_size"]) + (h * h + h)


@pytest.mark.parametrize(("file", "formula", "published"), [
    ("gpt2.json", gpt2_params, 124_439_808),  # openai-community/gpt2
    ("llama-2-7b.json", llama_params, 6_738_415_616),  # meta-llama/Llama-2-7b-hf
    ("llama-3-8b.json", llama_params, 8_030_261_248),  # meta-llama/Meta-Llama-3-8B
    ("llama-3.1-8b.json", llama_params, 8_030_261_248),  # meta-llama/Llama-3.1-8B
    ("mistral-7b.json", llama_params, 7_241_732_096),  # mistralai/Mistral-7B-v0.1
    ("mixtral-8x7b.json", llama_params, 46_702_792_704),  # mistralai/Mixtral-8x7B-v0.1
    ("qwen2-7b.json", llama_params, 7_615_616_512),  # Qwen/Qwen2-7B
    ("gpt-neox-20b.json", neox_params, 20_554_567_680),  # EleutherAI/gpt-neox-20b
])
def test_parameters_match_the_formula_and_the_published_count(file: str, formula: Any, published: int) -> None:
    c = cfg_json(file)
    assert formula(c) == published
    assert build_hf_model(HF / file, 1).params == published


def test_bert_counts_exactly_what_it_models_and_names_the_rest() -> None:
    c = cfg_json("bert-base-uncased.json")
    h = c["hidden_size"]
    assert bert_model_params(c) == 109_482_240  # google-bert/bert-base-uncased as BertModel (with pooler)
    m = build_hf_model(HF / "bert-base-uncased.json", 1)
    # BertForMaskedLM has no pooler; its MLM transform and decoder bias are named, not modelled
    assert m.params == bert_model_params(c) - (h * h + h)
    text = " ".join(m.assumptions)
    assert f"{h * h + 3 * h:,} parameters" in text and f"decoder bias ({c['vocab_size']:,}" in text
    assert "pooler" not in text  # BertForMaskedLM has none
    zoo = build_model("bert-base", 1)  # the built-in lacks only the token-type table
    assert m.params == zoo.params + c["type_vocab_size"] * h
    assert m.fwd_flops_per_sample() == zoo.fwd_flops_per_sample()
    assert not any(op.causal for la in m.layers for op in la.ops)


def _ir(m: Model) -> list[tuple[Any, ...]]:
    return [(la.name, la.kind, la.ops, la.tied_to, la.tied_op) for la in m.layers]


@pytest.mark.parametrize(("file", "zoo", "seq_len"), [
    ("gpt2.json", "gpt2", None),
    ("llama-2-7b.json", "llama2-7b", None),
    ("llama-3-8b.json", "llama3-8b", None),
    ("llama-3.1-8b.json", "llama3.1-8b", 8192),
    ("mixtral-8x7b.json", "mixtral-8x7b", 4096),
])
def test_imported_config_is_the_zoo_model_op_for_op(file: str, zoo: str, seq_len: int | None) -> None:
    for attention in ("flash", "unfused"):
        hf, built_in = build_hf_model(HF / file, 2, seq_len, attention), build_model(zoo, 2, seq_len, attention)
        assert _ir(hf) == _ir(built_in)
        assert (hf.params, hf.fwd_flops_per_sample(), hf.seq_len, hf.hyper, hf.family) == \
            (built_in.params, built_in.fwd_flops_per_sample(), built_in.seq_len, built_in.hyper, built_in.family)


def test_forward_flops_closed_form_with_gqa_and_qkv_bias() -> None:
    """Qwen2-7B: q/k/v/o GEMMs with 4 kv heads, attention 4 b a s^2 d, SwiGLU 6 s h f, LM head 2 s h v."""
    c = cfg_json("qwen2-7b.json")
    L, h, a, g, f, v = (c[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size", "vocab_size"))
    d, s, b = h // a, 4096, 2
    per_layer = 2 * s * h * (a + 2 * g) * d + 4 * a * s * s * d + 2 * s * a * d * h + 6 * s * h * f
    m = build_hf_model(HF / "qwen2-7b.json", b, s)
    got = sum(op.fwd_flops() for la in m.layers for op in la.ops if op.kind in CONTRACTION_KINDS)
    assert got == b * (L * per_layer + 2 * s * h * v)
    qkv, proj, fc1 = (next(op for op in m.layers[1].ops if op.name == n) for n in ("qkv", "proj", "fc1"))
    assert (qkv.extra_params, proj.extra_params, fc1.extra_params) == ((a + 2 * g) * d, 0, 0)


def test_explicit_head_dim_that_differs_from_hidden_over_heads(tmp_path: Path) -> None:
    """Mistral-NeMo's shape: 32 heads of 128 on a 5120 hidden (not 160), 8 kv heads."""
    c = {**cfg_json("mistral-7b.json"), "hidden_size": 5120, "num_hidden_layers": 40, "head_dim": 128,
         "vocab_size": 131072, "sliding_window": None}
    m = build_hf_model(write(tmp_path, c), 1, 1024)
    assert m.params == llama_params(c)
    qkv, attn = (next(op for op in m.layers[1].ops if op.name == n) for n in ("qkv", "attention"))
    assert (qkv.dims["q"], attn.dims["d"], attn.dims["o"]) == ((32 + 2 * 8) * 128, 128, 32 * 128)


def test_defaults_and_descriptions() -> None:
    assert load_hf_config(HF / "gpt2.json").seq_len == 1024
    assert load_hf_config(HF / "llama-3.1-8b.json").seq_len == 131072  # max_position_embeddings
    gpt2 = build_hf_model(HF / "gpt2.json", 1)
    assert gpt2.name == "gpt2-124m" and gpt2.assumptions == ()
    assert any(op.name == "embed_dropout" for la in gpt2.layers for op in la.ops)  # pdrop 0.1
    llama = build_hf_model(HF / "llama-2-7b.json", 1)
    assert llama.name == "meta-llama/Llama-2-7b-hf" and llama.assumptions == ()
    assert llama.layers[-1].tied_to is None and gpt2.layers[-1].tied_to == "embedding"
    l31 = load_hf_config(HF / "llama-3.1-8b.json")
    assert "rope_scaling llama3 x8" in l31.description and l31.assumptions == ()
    notes = {f: " ".join(load_hf_config(HF / f).assumptions) for f in
             ("mistral-7b.json", "gpt-neox-20b.json", "mixtral-8x7b.json", "qwen2-7b.json")}
    mistral = load_hf_config(HF / "mistral-7b.json")
    assert mistral.sliding_window == 4096 and "sliding_window 4096" in mistral.description  # modelled, noted
    assert "use_parallel_residual" in notes["gpt-neox-20b.json"] and "rotary_pct 0.25" in notes["gpt-neox-20b.json"]
    assert "balanced" in notes["mixtral-8x7b.json"]
    assert notes["qwen2-7b.json"] == ""  # use_sliding_window false
    assert set(READERS) == {"bert", "gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe",
                            "qwen2_moe", "deepseek_v3", "kimi_k2", "gpt_oss", "nemotron_h", "llama4",
                            "llama4_text"}


def test_name_model_type_and_folder_inference(tmp_path: Path) -> None:
    c = {k: v for k, v in cfg_json("llama-3-8b.json").items() if k != "model_type"}  # from architectures
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write(folder, {**c, "_name_or_path": "./runs/dpo-step-1000/"})
    cfg = load_hf_config(folder)  # a folder holding config.json
    assert cfg.name == "dpo-step-1000" and cfg.kv_heads == 8


def test_overrides_apply_on_top() -> None:
    c = cfg_json("llama-2-7b.json")
    m = build_hf_model(HF / "llama-2-7b.json", 1, 2048, layers=4)
    assert m.params == llama_params({**c, "num_hidden_layers": 4}) and m.seq_len == 2048
    assert m.hyper["layers"] == 4
    assert build_hf_model(HF / "llama-2-7b.json", 1, kv_heads=8).params == \
        llama_params({**c, "num_key_value_heads": 8})
    assert hf_transformer_config(HF / "llama-2-7b.json", hidden=2048).head_dim == 64
    # a learned position table keeps its n_positions rows whatever sequence is trained
    assert build_hf_model(HF / "gpt2.json", 1, 512).params == gpt2_params(cfg_json("gpt2.json"))


def one_line(exc: pytest.ExceptionInfo[ConfigError], *names: str) -> str:
    text = str(exc.value)
    assert "\n" not in text
    for name in names:
        assert name in text, text
    return text


@pytest.mark.parametrize(("overrides", "field"), [
    ({"heads": 7}, "model.heads"),
    ({"hidden": 4100}, "model.hidden"),
    ({"kv_heads": 5}, "model.kv_heads"),
])
def test_inconsistent_overrides_name_the_flag(overrides: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build_hf_model(HF / "llama-2-7b.json", 1, **overrides)
    assert exc.value.field == field
    one_line(exc)


def test_sequence_beyond_learned_positions() -> None:
    with pytest.raises(ConfigError) as exc:
        build_hf_model(HF / "gpt2.json", 1, 2048)
    one_line(exc, "model.seq_len", "1024")


def _edit(file: str, drop: str | None = None, **values: Any) -> dict[str, Any]:
    c = cfg_json(file)
    if drop:
        del c[drop]
    return {**c, **values}


@pytest.mark.parametrize(("content", "names"), [
    (None, ["model.hf_config", "cannot read", "nothing is downloaded"]),
    ("{\"model_type\": \"llama\",", ["model.hf_config", "not JSON", "line 1"]),
    ("[1, 2]", ["model.hf_config", "not an object"]),
    ("\udcff", ["model.hf_config", "not UTF-8"]),
    ({"model_type": "t5"}, ["hf_config.model_type", "'t5'", ", ".join(READERS)]),
    ({"model_type": "t5gemma"}, ["hf_config.model_type", "'t5gemma'"]),
    ({"model_type": "llama4", "vision_config": {}}, ["hf_config.text_config", "missing"]),
    (_edit("nemotron-3-nano-30b-a3b.json", hybrid_override_pattern="MEM*"),
     ["hf_config.hybrid_override_pattern", "52 letters"]),
    (_edit("nemotron-3-nano-30b-a3b.json", hybrid_override_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEMX"),
     ["hf_config.hybrid_override_pattern", "M * E -"]),
    (_edit("nemotron-3-nano-30b-a3b.json", num_nextn_predict_layers=1, mtp_hybrid_override_pattern="M*E"),
     ["hf_config.mtp_hybrid_override_pattern", "*E"]),
    ({"vocab_size": 3}, ["hf_config.model_type", "missing"]),
    (_edit("llama-2-7b.json", drop="hidden_size"), ["hf_config.hidden_size", "missing"]),
    (_edit("gpt2.json", drop="n_embd"), ["hf_config.n_embd", "missing"]),
    (_edit("mixtral-8x7b.json", drop="num_local_experts"), ["hf_config.num_local_experts", "missing"]),
    (_edit("bert-base-uncased.json", drop="max_position_embeddings"), ["hf_config.max_position_embeddings"]),
    (_edit("llama-2-7b.json", num_hidden_layers="32"), ["hf_config.num_hidden_layers", "positive integer"]),
    (_edit("llama-2-7b.json", num_attention_heads=30), ["hf_config.num_attention_heads", "30", "4096"]),
    (_edit("gpt2.json", n_head=7), ["hf_config.n_head", "768"]),
    (_edit("llama-3-8b.json", num_key_value_heads=5), ["hf_config.num_key_value_heads", "5", "32"]),
    (_edit("mixtral-8x7b.json", num_experts_per_tok=9), ["hf_config.num_experts_per_tok", "9"]),
    (_edit("llama-3.1-8b.json", rope_scaling="yes"), ["hf_config.rope_scaling"]),
    (_edit("gpt2.json", resid_pdrop=1.5), ["hf_config.resid_pdrop", "probability"]),
    (_edit("llama-2-7b.json", tie_word_embeddings="no"), ["hf_config.tie_word_embeddings"]),
])
def test_bad_configs_give_one_line_naming_the_key(tmp_path: Path, content: Any, names: list[str]) -> None:
    path = tmp_path / "missing.json" if content is None else write(tmp_path, content)
    with pytest.raises(ConfigError) as exc:
        load_hf_config(path)
    one_line(exc, *names)


def test_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_hf_config(tmp_path)
    one_line(exc, "model.hf_config", "config.json")


def test_python_api_takes_hf_config_and_overrides() -> None:
    r = trainsim.simulate(hf_config=str(HF / "gpt-neox-20b.json"), cluster="dgx-a100", nodes=1, layers=4,
                          seq_len=1024, strategy={"tp": 8, "global_batch": 4})
    assert r.model == "gpt_neox-20.6b" and r.tokens_per_sample == 1024
    assert r.model_params == build_hf_model(HF / "gpt-neox-20b.json", 1, 1024, layers=4).params
    assert any("use_parallel_residual" in a for a in r.model_assumptions)
    assert "model_assumptions" in r.to_json()
    with pytest.raises(ConfigError) as exc:
        trainsim.simulate(model="gpt2", hf_config=str(HF / "gpt2.json"), cluster="pcie-titanxp")
    one_line(exc, "model.name", "hf_config")


# ---- CLI end to end ---------------------------------------------------------------------------------------

SMALL_JOB = ["--cluster", "pcie-titanxp", "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "8",
             "--micro-batch", "2"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=120)


def test_cli_hf_config_simulates_exactly_like_the_zoo_model(tmp_path: Path) -> None:
    hf_json, zoo_json, dumped = tmp_path / "hf.json", tmp_path / "zoo.json", tmp_path / "job.yaml"
    p = run_cli("simulate", "--hf-config", str(HF / "gpt2.json"), *SMALL_JOB, "--json", str(hf_json), "-q",
                "--dump-config", str(dumped))
    assert p.returncode == 0, p.stderr
    assert run_cli("simulate", "--model", "gpt2", *SMALL_JOB, "--json", str(zoo_json), "-q").returncode == 0
    hf, zoo = json.loads(hf_json.read_text()), json.loads(zoo_json.read_text())
    assert hf.pop("model") == "gpt2-124m" and zoo.pop("model") == "gpt2"
    for d in (hf, zoo):
        d.pop("simulation_wall_s")
    hf_job, zoo_job = hf.pop("job"), zoo.pop("job")  # the job as it ran names its model's source
    assert hf_job["model"].pop("hf_config") == str((HF / "gpt2.json").resolve()) and zoo_job["model"].pop("name") == "gpt2"
    assert hf_job == zoo_job and hf == zoo
    job = dumped.read_text()
    assert str((HF / "gpt2.json").resolve()) in job and "name:" not in job.split("cluster:")[0]
    again = tmp_path / "again.json"
    assert run_cli("simulate", str(dumped), "--json", str(again), "-q").returncode == 0
    assert json.loads(again.read_text())["iteration_time_s"] == hf["iteration_time_s"]


def test_cli_yaml_hf_config_with_overrides(tmp_path: Path) -> None:
    job = write(tmp_path, "model: {hf_config: %s, seq_len: 512, layers: 6}\ncluster: {name: pcie-titanxp}\n"
                "strategy: {dp: 8, global_batch: 16, micro_batch: 2}\n" % (HF / "llama-2-7b.json"), "job.yaml")
    out = tmp_path / "out.json"
    p = run_cli("simulate", str(job), "--json", str(out), "-q")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["model"] == "meta-llama/Llama-2-7b-hf"
    assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 512, rel=1e-12)


@pytest.mark.parametrize(("args", "names"), [
    (["--hf-config", str(HF / "no-such-config.json")], ["model.hf_config", "no-such-config.json"]),
    (["--hf-config", str(HF / "README.md")], ["model.hf_config", "not JSON"]),
    (["--hf-config", str(HF / "gpt2.json"), "--model", "gpt2"], ["--hf-config", "--model"]),
    (["--hf-config", str(HF / "gpt2.json"), "--heads", "5"], ["model.heads", "768"]),
])
def test_cli_bad_hf_input_is_one_line_and_exit_2(args: list[str], names: list[str]) -> None:
    p = run_cli("simulate", *args, *SMALL_JOB, "-q")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for name in names:
        assert name in lines[0], lines[0]


# ---- the MoE families (issue 23): published totals ------------------------------------------------------

@pytest.mark.parametrize(("file", "published", "active"), [
    ("qwen3-30b-a3b.json", 30_532_122_624, 3.3e9),  # the safetensors total, exactly; Qwen: 3.3B activated
    # DeepSeek: 685B with the MTP module (671B + 14B, the latter counting its own copies of the embedding and
    # head, which trainsim shares with the main model's)
    ("deepseek-v3.json", 685e9, 37e9),
    ("gpt-oss-120b.json", 116.83e9, 5.1e9),  # OpenAI's model card: 116.83B total, 5.13B active
    ("nemotron-3-nano-30b-a3b.json", 31.6e9, 3.6e9),  # NVIDIA's model card: 31.6B total, 3.6B active with embeddings
])
def test_moe_configs_count_their_published_parameters(file: str, published: float, active: float) -> None:
    m = build_hf_model(HF / file, 1, 4096)
    assert m.params == pytest.approx(published, rel=0.01)


def test_moe_readers_map_the_architecture() -> None:
    qwen = load_hf_config(HF / "qwen3-30b-a3b.json")
    assert (qwen.head_size, qwen.qk_norm, qwen.experts, qwen.top_k, qwen.expert_ffn) == (128, True, 128, 8, 768)
    ds = load_hf_config(HF / "deepseek-v3.json")
    assert (ds.kv_lora_rank, ds.q_lora_rank, ds.head_size, ds.qk_rope_dim, ds.v_head_size) == (512, 1536, 192, 64, 128)
    assert (ds.first_dense_layers, ds.shared_expert_ffn, ds.mtp_layers) == (3, 2048, 1)
    assert "sigmoid" in ds.description  # its grouped sigmoid routing is named, priced as plain top-k
    oss = load_hf_config(HF / "gpt-oss-120b.json")
    assert (oss.sliding_window, oss.window_layers, oss.attention_sinks, oss.top_k) == (128, "alternate", True, 4)
    assert "sliding_window 128 on every layer" not in oss.description  # alternating, not on every layer
    kimi = load_hf_config(write_tmp({**cfg_json("deepseek-v3.json"), "model_type": "kimi_k2", "n_routed_experts": 384,
                                     "num_attention_heads": 64, "first_k_dense_replace": 1}))
    assert (kimi.experts, kimi.heads, kimi.first_dense_layers) == (384, 64, 1)


def test_nemotron_h_reads_its_hybrid_pattern_either_way() -> None:
    """Nemotron-H's pattern as hybrid_override_pattern letters or as layers_block_type names: the same model, 23
    Mamba2 mixers (chunk 128 as its config states), 23 MoE MLPs and 6 attention layers."""
    nano = load_hf_config(HF / "nemotron-3-nano-30b-a3b.json")
    assert (nano.layer_pattern.count("M"), nano.layer_pattern.count("E"), nano.layer_pattern.count("*")) == (23, 23, 6)
    assert (nano.mamba_heads, nano.mamba_head_dim, nano.mamba_state, nano.mamba_groups, nano.mamba_chunk) == \
        (64, 64, 128, 8, 128)
    assert (nano.mlp, nano.experts, nano.top_k, nano.expert_ffn, nano.shared_expert_ffn, nano.head_size) == \
        ("relu2", 128, 6, 1856, 3712, 128)
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    data = cfg_json("nemotron-3-nano-30b-a3b.json")
    listed = {k: v for k, v in data.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[c] for c in data["hybrid_override_pattern"]]
    assert load_hf_config(write_tmp(listed)).layer_pattern == nano.layer_pattern


def test_llama4_maverick_and_scout() -> None:
    """Llama 4 Maverick (its text_config as published): 128 experts top-1 and a shared expert on every other layer,
    from the second, dense MLPs of intermediate_size_mlp between: Meta's 400B total, 17B active; its vision tower is
    named as not modelled. Scout is the same text model with 16 experts on every layer (and QK-norm): 107.8B of the
    card's 109B, which counts the vision tower too."""
    mav = load_hf_config(HF / "llama-4-maverick-17b-128e.json")
    assert mav.layer_pattern == "*-*E" * 24 and mav.layers == 96 and (mav.ffn, mav.expert_ffn) == (16384, 8192)
    assert (mav.experts, mav.top_k, mav.shared_expert_ffn, mav.head_size) == (128, 1, 8192, None)
    assert any("vision tower" in a for a in mav.assumptions)
    m = build_hf_model(HF / "llama-4-maverick-17b-128e.json", 1, 4096)
    assert m.params == pytest.approx(400e9, rel=0.01) and m.active_params == pytest.approx(17e9, rel=0.02)
    data = cfg_json("llama-4-maverick-17b-128e.json")
    text = {**data["text_config"], "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True}
    scout = load_hf_config(write_tmp({**data, "text_config": text}))
    assert (scout.layer_pattern, scout.layers, scout.experts, scout.qk_norm) == ("", 48, 16, True)
    assert build_transformer(scout, 1, 4096).params == pytest.approx(107.77e9, rel=0.001)
    # a text-only llama4_text config reads the same model
    alone = load_hf_config(write_tmp({**data["text_config"], "architectures": ["Llama4ForCausalLM"]}))
    assert (alone.layer_pattern, alone.experts) == (mav.layer_pattern, mav.experts)


def test_nemotron_3_super_latent_moe_counts_its_published_parameters() -> None:
    """Nemotron 3 Super's published sizes (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B: 88 layers, 512 experts of 2688
    top-22 in a LatentMoE width of 1024, a shared expert of 5376, Mamba2 128 x 64, one MTP module of *E): 120B total
    and 12B active as NVIDIA states them, without the MTP module. By hand per LatentMoE layer: router 4096 x 512,
    the projections 4096 x 1024 down and up, 512 experts of 2 x 1024 x 2688 (squared ReLU: two matrices), the
    shared expert's 2 x 4096 x 5376."""
    pattern = "ME" * 40 + "*" * 8
    data = {**cfg_json("nemotron-3-nano-30b-a3b.json"), "hidden_size": 4096, "num_hidden_layers": 88,
            "hybrid_override_pattern": pattern, "mamba_num_heads": 128, "n_routed_experts": 512,
            "num_experts_per_tok": 22, "moe_intermediate_size": 2688, "moe_latent_size": 1024,
            "moe_shared_expert_intermediate_size": 5376, "num_nextn_predict_layers": 1,
            "mtp_hybrid_override_pattern": "*E"}
    cfg = load_hf_config(write_tmp(data))
    assert (cfg.moe_latent, cfg.mtp_layers) == (1024, 1)
    m = build_transformer(replace(cfg, mtp_layers=0), 1, 4096)
    assert m.params == pytest.approx(120e9, rel=0.01) and m.active_params == pytest.approx(12.7e9, rel=0.01)
    ops = {op.name: op for lay in m.layers for op in lay.ops}
    assert ops["router"].params == 4096 * 512 and ops["latent_down"].params == ops["latent_up"].params == 4096 * 1024
    assert ops["expert_fc1"].params == ops["expert_fc2"].params == 512 * 1024 * 2688
    assert ops["dispatch"].output == ("e", "c", "h") and ops["dispatch"].dims["h"] == 1024  # latent tokens cross
    with_mtp = build_transformer(cfg, 1, 4096)
    assert with_mtp.params > m.params  # the MTP module (attention + LatentMoE + projection) on top


def write_tmp(data: dict[str, Any]) -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp())
    return write(d, data)


@pytest.mark.parametrize(("edit", "field"), [
    ({"layer_types": ["full_attention", "sliding_attention"] * 18}, "hf_config.layer_types"),
    ({"moe_layer_freq": 2}, "hf_config.moe_layer_freq"),
    ({"first_k_dense_replace": 61}, "hf_config.first_k_dense_replace"),
    ({"mlp_only_layers": [3]}, "hf_config.mlp_only_layers"),
])
def test_moe_layouts_trainsim_cannot_build_are_refused(edit: dict[str, Any], field: str) -> None:
    base = {"hf_config.layer_types": "gpt-oss-120b.json", "hf_config.moe_layer_freq": "deepseek-v3.json",
            "hf_config.first_k_dense_replace": "deepseek-v3.json",
            "hf_config.mlp_only_layers": "qwen3-30b-a3b.json"}[field]
    with pytest.raises(ConfigError, match=rf"^{field.replace('.', '[.]')}:"):
        load_hf_config(write_tmp({**cfg_json(base), **edit}))
