import pytest

from tinker_cookbook import hyperparam_utils as hp
from tinker_cookbook.exceptions import ConfigurationError


def test_get_lr_llama_3_1_8b_matches_the_sweep_page():
    # 5e-5 * 10 * (2000 / 4096) ** 0.781 = 2.856415e-4 (the docs print 0.0002856415043086949)
    assert hp.get_lr("meta-llama/Llama-3.1-8B") == pytest.approx(0.0002856415043086949, rel=1e-9)


def test_get_lr_hand_values():
    # Qwen3-8B: 5e-4 * (2000/4096) ** 0.0775 = 5e-4 * 0.945958... = 4.7298e-4
    assert hp.get_lr("Qwen/Qwen3-8B") == pytest.approx(5e-4 * (2000 / 4096) ** 0.0775)
    assert hp.get_lr("Qwen/Qwen3-8B") == pytest.approx(4.7298e-4, rel=1e-4)
    # Llama-3.2-1B: hidden 2048 -> 5e-4 * (2000/2048) ** 0.781 = 4.9079e-4
    assert hp.get_lr("meta-llama/Llama-3.2-1B") == pytest.approx(4.9079e-4, rel=1e-4)
    # full fine-tuning drops the LoRA factor of 10; a ":variant" suffix names the same shape
    assert hp.get_lr("meta-llama/Llama-3.1-8B", is_lora=False) == pytest.approx(2.856415e-5, rel=1e-6)
    assert hp.get_lr("Qwen/Qwen3-8B:my-finetune") == hp.get_lr("Qwen/Qwen3-8B")
    assert hp.get_lora_lr_over_full_finetune_lr("anything") == 10.0


def test_get_lr_smollm2_uses_the_llama_exponent():
    # SmolLM2 is a Llama-architecture model with hidden size 576: 5e-4 * (2000/576) ** 0.781 = 1.3215e-3
    assert hp.get_lr("HuggingFaceTB/SmolLM2-135M-Instruct") == pytest.approx(1.3215e-3, rel=1e-3)


def test_lora_param_count_matches_published_per_rank_components():
    # Per-rank counts (sum of fan_in + fan_out over the targeted matrices):
    # Llama-3.1-8B: mlp 32 * 3 * (4096 + 14336) = 1,769,472; attn 32 * (8192 + 5120 + 5120 + 8192) = 851,968;
    # unembed 4096 + 128256 = 132,352.
    assert hp.get_lora_param_count("meta-llama/Llama-3.1-8B", 1, True, False, False) == 1_769_472
    assert hp.get_lora_param_count("meta-llama/Llama-3.1-8B", 1, False, True, False) == 851_968
    assert hp.get_lora_param_count("meta-llama/Llama-3.1-8B", 1, False, False, True) == 132_352
    # Qwen3-8B: attn 36 * (8192 + 5120 + 5120 + 8192) = 958,464; unembed 4096 + 151936 = 156,032
    assert hp.get_lora_param_count("Qwen/Qwen3-8B", 1, False, True, False) == 958_464
    assert hp.get_lora_param_count("Qwen/Qwen3-8B", 1, False, False, True) == 156_032
    # Llama-3.2-1B at rank 32: 32 * (491,520 + 212,992 + 130,304)
    assert hp.get_lora_param_count("meta-llama/Llama-3.2-1B", 32) == 32 * (491_520 + 212_992 + 130_304)


def test_moe_shares_the_hidden_side_factor():
    # Qwen3-30B-A3B mlp per rank: 48 layers * 3 * (2048 + 128 * 768) = 14,450,688
    assert hp.get_lora_param_count("Qwen/Qwen3-30B-A3B", 1, True, False, False) == 48 * 3 * (2048 + 128 * 768)


def test_lora_param_count_from_a_config_equals_what_peft_creates():
    """The tiny test model's dimensions come from its config; peft on the same targets must agree."""
    import peft

    from tinker_cookbook.engine.models import load_model

    model = load_model("tinker-cookbook/tiny-smollm2")
    config = peft.LoraConfig(
        r=4, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj", "lm_head"],
    )
    peft_model = peft.get_peft_model(model, config)
    created = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    assert hp.get_lora_param_count("tinker-cookbook/tiny-smollm2", lora_rank=4) == created
    assert hp.get_model_dims("tinker-cookbook/tiny-qwen3").family == "qwen"


def test_unknown_model_and_bad_rank_are_clear_errors(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigurationError, match="model_name='nobody/nothing'") as info:
        hp.get_lr("nobody/nothing")
    assert "Qwen/Qwen3-8B" in str(info.value) and "A3B" not in str(info.value)  # dense ones suggested
    with pytest.raises(ConfigurationError, match="lora_rank=0"):
        hp.get_lora_param_count("Qwen/Qwen3-8B", lora_rank=0)


def test_vision_moe_models_size_by_their_language_model():
    # LoRA adapts a Qwen3-VL-MoE model's language model only, which has the shape of its text sibling.
    assert hp.get_lr("Qwen/Qwen3-VL-30B-A3B-Instruct") == hp.get_lr("Qwen/Qwen3-30B-A3B")
    assert hp.get_model_dims("tinker-cookbook/tiny-qwen3-vl-moe") == hp.get_model_dims("tinker-cookbook/tiny-qwen3-moe")
