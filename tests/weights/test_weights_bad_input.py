"""Bad input to the weights tools: one clear error each, and nothing left behind that looks complete."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from tests.weights.conftest import QWEN3
from tinker_cookbook import cli, tinker, weights
from tinker_cookbook.exceptions import CheckpointError, ConfigurationError, WeightsError


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_training_state_checkpoint_is_not_a_sampler_checkpoint(tmp_path: Path):
    tc = tinker.ServiceClient().create_lora_training_client(QWEN3, rank=2)
    state = tc.save_state("s").result().path
    with pytest.raises(CheckpointError, match="not a sampler checkpoint.*training-state.*save_weights_for_sampler"):
        weights.build_hf_model(adapter_path=state, output_path=str(tmp_path / "m"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a sampler checkpoint.*no adapter_model.safetensors"):
        weights.build_hf_model(adapter_path=str(tmp_path / "empty"), output_path=str(tmp_path / "m"))
    with pytest.raises(tinker.BadRequestError, match="tinker://"):
        weights.build_hf_model(adapter_path="tinker://nonsense", output_path=str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def _downloaded(checkpoint: str, tmp_path: Path) -> Path:
    return Path(weights.download(tinker_path=checkpoint, output_dir=str(tmp_path / "dl")))


def test_missing_base_model_and_wrong_base_model(qwen3_checkpoint, smollm2_checkpoint, tmp_path: Path):
    adapter = _downloaded(qwen3_checkpoint, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "nobody/missing"}))
    with pytest.raises(WeightsError, match="base model 'nobody/missing' is missing"):
        weights.build_hf_model(adapter_path=str(adapter), output_path=str(tmp_path / "m"))
    with pytest.raises(WeightsError, match="trained on another model"):
        weights.build_hf_model(adapter_path=smollm2_checkpoint, output_path=str(tmp_path / "m"), base_model=QWEN3)
    assert not (tmp_path / "m").exists()


def test_fused_expert_adapters_are_refused_by_name(tmp_path: Path):
    # A mixture-of-experts adapter holds PEFT target_parameters pairs; merge must say so, not blame the base model.
    tc = tinker.ServiceClient().create_lora_training_client("tinker-cookbook/tiny-qwen3-moe", rank=2)
    path = tc.save_weights_for_sampler("moe").result().path
    with pytest.raises(WeightsError, match="fused expert weights.*experts.*weights adapter"):
        weights.build_hf_model(adapter_path=path, output_path=str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_unsupported_dtype_is_refused_before_any_work(tmp_path: Path):
    with pytest.raises(ConfigurationError, match="dtype='int8' is not offered.*bfloat16"):
        weights.build_hf_model(adapter_path="tinker://never/sampler_weights/read", output_path=str(tmp_path / "m"),
                               dtype="int8")


def test_disk_filling_mid_write_leaves_nothing(qwen3_checkpoint, tmp_path: Path, monkeypatch):
    from tinker_cookbook.weights import _merge

    real_write, calls = _merge.write_safetensors, []

    def write_until_full(path, layout, tensors):
        calls.append(path)
        if len(calls) == 2:  # the second shard: half a file, then the disk is full
            Path(path).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, layout, tensors)

    monkeypatch.setattr(_merge, "write_safetensors", write_until_full)
    with pytest.raises(WeightsError, match="disk filled up.*nothing was left"):
        weights.build_hf_model(adapter_path=qwen3_checkpoint, output_path=str(tmp_path / "m"), max_shard_bytes=10**6)
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary folder


def test_gguf_of_an_unsupported_architecture(tmp_path: Path):
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    with pytest.raises(WeightsError, match="model_type='qwen3_vl' is not supported yet"):
        weights.export_gguf(str(tmp_path / "vl"), str(tmp_path / "m.gguf"))
    with pytest.raises(WeightsError, match="not a model folder"):
        weights.export_gguf(str(tmp_path), str(tmp_path / "m.gguf"))


def test_cli_merge_export_and_offline_publish(smollm2_checkpoint, tmp_path: Path, capsys, monkeypatch):
    merged = tmp_path / "merged"
    code, out, err = _run(capsys, "--format", "json", "weights", "merge", smollm2_checkpoint, "-o", str(merged))
    assert code == 0, err
    assert "model.safetensors" in json.loads(out)["files"]
    code, _, err = _run(capsys, "weights", "merge", smollm2_checkpoint, "-o", str(merged))
    assert code == 1 and err.count("\n") == 1 and err.startswith("Error:") and "--force" in err
    code, _, err = _run(capsys, "weights", "export-gguf", str(merged), "-o", str(tmp_path / "m.gguf"), "--type", "q8_0",
                        "--ollama")
    assert code == 0, err
    assert (tmp_path / "Modelfile").is_file()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = _run(capsys, "weights", "publish", str(merged), "--repo", "someone/tiny-chat", "--private")
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("Error:")
    assert "nothing was pushed" in err and "someone/tiny-chat (private)" in err and "model.safetensors" in err
    # from a tinker:// path: the merged folder is written first, then the same one error
    code, _, err = _run(capsys, "weights", "publish", smollm2_checkpoint, "--repo", "someone/x", "-o",
                        str(tmp_path / "for-hub"))
    assert code == 1 and (tmp_path / "for-hub" / "config.json").is_file()
    assert err.splitlines()[-1].startswith("Error:") and sum(line.startswith("Error:") for line in err.splitlines()) == 1
    code, _, err = _run(capsys, "weights", "publish", str(merged), "--repo", "not a repo")
    assert code == 1 and "USER/NAME" in err
    shutil.rmtree(merged)
