"""``--workload hf:path/to/config.json``: any local transformers config with random weights,
its options, its study name and path, and one line for every config it cannot build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.errors import WorkloadError
from autotune.memory.activations import profile
from autotune.memory.memory_model import model_facts
from autotune.workloads import (
    CausalLMWorkload,
    MaskedLMWorkload,
    absolute_workload_ref,
    get_workload,
    workload_study_name,
)

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
}
BERT = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
}


def write(folder: Path, config: dict, name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(config))
    return path


def train_step(ref: str) -> tuple[object, torch.Tensor]:
    workload = get_workload(ref)
    model = workload.build_model()
    batch = workload.make_batch(2, torch.device("cpu"))
    loss = workload.loss(model, batch)
    loss.backward()
    return workload, loss


def test_a_causal_config_folder_builds_and_trains(tmp_path: Path) -> None:
    write(tmp_path / "my-llama", LLAMA)
    workload, loss = train_step(f"hf:{tmp_path / 'my-llama'}")
    assert isinstance(workload, CausalLMWorkload) and not isinstance(workload, MaskedLMWorkload)
    assert torch.isfinite(loss)
    # defaults: the config's positions (up to 2048), global batch 32
    assert (workload.seq_len, workload.default_global_batch) == (256, 32)
    assert workload.num_layers == 3
    assert model_facts(workload, 100_000).params > 0
    assert profile(workload, 1, "bf16", True, "dropped").backward_peak_bytes > 0  # by layers


def test_options_set_sequence_and_batch(tmp_path: Path) -> None:
    path = write(tmp_path / "my-llama", LLAMA)
    workload = get_workload(f"hf:{path}?seq=64&batch=8")
    assert (workload.seq_len, workload.tokens_per_sample, workload.default_global_batch) == (
        64,
        64,
        8,
    )
    assert workload.make_batch(2, torch.device("cpu"))["input_ids"].shape == (2, 64)


def test_a_masked_lm_config_trains_on_masked_tokens(tmp_path: Path) -> None:
    write(tmp_path / "bert", BERT)
    workload, loss = train_step(f"hf:{tmp_path / 'bert'}?seq=32")
    assert isinstance(workload, MaskedLMWorkload) and torch.isfinite(loss)
    labels = workload.make_batch(4, torch.device("cpu"))["labels"]
    share = (labels != -100).float().mean().item()
    assert 0.05 < share < 0.3  # BERT's 15%


def test_study_name_and_absolute_reference(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "models" / "my-llama", LLAMA)
    monkeypatch.chdir(tmp_path)
    ref = "hf:models/my-llama?seq=64"
    assert workload_study_name(ref) == "my-llama-seq64"
    assert workload_study_name("hf:models/my-llama/config.json") == "my-llama"
    absolute = absolute_workload_ref(ref)
    assert absolute == f"hf:{tmp_path / 'models' / 'my-llama' / 'config.json'}?seq=64"
    monkeypatch.chdir("/")
    assert get_workload(absolute).seq_len == 64
    # equal references share the memory model's cached traces
    assert get_workload(absolute) == get_workload(absolute)


@pytest.mark.parametrize(
    ("config", "query", "message"),
    [
        (
            {**LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}},
            "",
            "needs remote code",
        ),
        ({**LLAMA, "model_type": "not-a-model"}, "", "model_type 'not-a-model' is not"),
        ({**LLAMA, "architectures": ["FooForCausalLM"]}, "", "'FooForCausalLM' is not in"),
        (LLAMA, "?seq=512", "seq=512 exceeds the config's 256 positions"),
        (LLAMA, "?sequence=64", "cannot read option 'sequence=64'"),
        (LLAMA, "?batch=0", "batch='0' is not a positive integer"),
        (LLAMA, "?head=masked", "has no masked LM for llama"),
        ({**LLAMA, "num_attention_heads": 5}, "", "transformers cannot read"),
    ],
)
def test_configs_it_cannot_build_get_one_line(
    tmp_path: Path, config: dict, query: str, message: str
) -> None:
    path = write(tmp_path, config)
    with pytest.raises(WorkloadError) as error:
        get_workload(f"hf:{path}{query}")
    text = str(error.value)
    assert message in text and "\n" not in text


def test_a_missing_or_broken_file_gets_one_line(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no config file at"):
        get_workload(f"hf:{tmp_path / 'nothing'}")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="is not JSON"):
        get_workload(f"hf:{tmp_path}")
