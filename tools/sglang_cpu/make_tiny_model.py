"""Write a tiny Llama model directory (config.json and a tokenizer) for SGLang's --load-format dummy.

2 layers, hidden size 64: the server runs it on a CPU in well under a second a step; the weights
are random (dummy), so outputs mean nothing, but scheduling, the KV pool and the radix cache are
real. The tokenizer (tokenizer.json, tokenizer_config.json: topas.sglang.text, one private-use
character per token id, vocabulary = the config's 32,000) is used only by servers started without
--skip-tokenizer-init, for text requests through a text-matching router (make test-cluster).
Usage: python make_tiny_model.py DIR (idempotent: rewrites only when the content differs).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's topas
from topas.sglang.text import write_tokenizer  # noqa: E402

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def main(out: str) -> Path:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    text = json.dumps(CONFIG, indent=2, sort_keys=True) + "\n"
    p = d / "config.json"
    if not p.exists() or p.read_text() != text:
        p.write_text(text)
    write_tokenizer(d, CONFIG["vocab_size"], CONFIG["max_position_embeddings"])
    print(d)
    return d


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".venvs/sglang-cpu/tiny-llama")
