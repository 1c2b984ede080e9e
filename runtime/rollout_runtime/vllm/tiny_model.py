"""Write the tiny random-weight Llama that the real-vLLM tier serves: nothing is downloaded.

Run with the vLLM tool's interpreter (it has torch, transformers and tokenizers; the project's venv has none of
them): ``<vllm venv>/bin/python tiny_model.py OUT_DIR [--seed N]``. It writes:

- ``OUT_DIR/v1`` and ``OUT_DIR/v2``: the same architecture and tokenizer with two weight sets (seeds N and N+1), so
  a reload from ``v2`` visibly changes the weights (vLLM's ``/weight_checker`` checksums, and the tokens);
- a byte-level BPE tokenizer trained here on a fixed corpus (about 1,000 tokens: any text encodes) with a plain
  chat template, saved beside each weight set as a fast tokenizer.

Everything is deterministic from the seed and the pinned torch/tokenizers versions. The shape is the smallest vLLM's
CPU backend serves: 2 layers, hidden 64, 2 heads of 32 (its CPU attention needs a head size of at least 32).
Standard library at module level, so the project's tools can import this file's constants without torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB_SIZE = 1024
MAX_POSITIONS = 256
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
WEIGHT_SETS = ("v1", "v2")
_WORDS = (
    "the a of and to in is it you that he was for on are with as his they be at one have this from or had by"
    " word but what some we can out other were all there when up use your how said an each she which do their"
    " time if will way about many then them write would like so these her long make thing see him two has look"
    " more day could go come did number sound no most people my over know water than call first who may down"
    " side been now find reverse answer question prompt rollout shard token weight version reward policy"
)


def corpus() -> list[str]:
    """A fixed training text: English-ish words, digits and punctuation, enough for ~1,000 merges."""
    words = _WORDS.split()
    lines = []
    for i in range(400):
        picked = [words[(i * 7 + j * 13) % len(words)] for j in range(12)]
        lines.append(" ".join(picked) + f" {i} + {i * 3 % 97} = {i + i * 3 % 97}.")
    return lines


def write_tokenizer(out: Path) -> None:
    """Train the byte-level BPE and save it as a transformers fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=MAX_POSITIONS
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def write_weights(out: Path, seed: int, vocab_size: int, bos: int, eos: int) -> None:
    """A random-weight LlamaForCausalLM (safetensors, float32) from ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger than the default init: the output varies with the weights, not a constant
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for index, name in enumerate(WEIGHT_SETS):
        target: Path = args.out / name
        target.mkdir(parents=True, exist_ok=True)
        write_tokenizer(target)
        vocab = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
        write_weights(target, args.seed + index, len(vocab), vocab["<s>"], vocab["</s>"])
    print(json.dumps({"model": str(args.out / WEIGHT_SETS[0]), "sets": list(WEIGHT_SETS)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
