"""The tiny random Llama-style model the vLLM test server serves (run by dev/vllm with
the vLLM environment's Python; torch, tokenizers and transformers live only there).

    vllm_model.py build DIR       write the model and its tokenizer to DIR (no download)
    vllm_model.py logprobs DIR    read a JSON list of {"prompt_ids": [...],
                                  "completion_ids": [...]} on stdin and print, for each,
                                  the log-probabilities transformers gives the completion
                                  tokens (the tests' reference for vLLM's)

Deterministic: the tokenizer is trained on a corpus generated here from a fixed seed,
and the weights come from a fixed torch seed, so every build writes the same bytes.
The chat template is ChatML with tools in the form vLLM's `hermes` tool parser reads:
calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20260101
VOCAB_SIZE = 1024
#: Positions the model takes, and dev/vllm's --max-model-len: real agent prompts run to
#: thousands of tokens (a Daydreams call is ~3,700 of this tokenizer's). RoPE has no
#: weights, so this changes config.json only.
CONTEXT = 8192
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Plain added tokens (not special), so decoding keeps them for the tool parser.
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
WORDS = """\
the a an of to and in is it you that for on with as are this be at or from by not
have what all can your will one there use when which more out if about how up so
agent episode step reward group rollout token prompt completion model train data
weather city temperature forecast tool call result answer question search find
open close read write file name value list number string object true false null
paris oslo tokyo lima cairo sunny rain snow wind cold warm hot today tomorrow week
please thanks hello world yes no maybe done error retry again next last first
"""
PUNCT = [".", ",", "?", "!", ":", ";"]

# ChatML; with tools, a system turn lists them and says how to call one.
CHAT_TEMPLATE = """\
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
<|im_start|>system
{% if system %}{{ system }}

{% endif %}You may call these functions, one JSON signature per line:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
To call one, answer <tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call>.<|im_end|>
{% elif system is not none -%}
<|im_start|>system
{{ system }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user
{% endif %}<tool_response>
{{ m.content }}
</tool_response>
{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif -%}
{%- else -%}
<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif -%}
{%- for call in m.tool_calls or [] -%}
{%- set f = call.function if call.function is defined else call -%}
{%- if m.content or not loop.first %}
{% endif %}<tool_call>
{"name": {{ f.name | tojson }}, "arguments": \
{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""


def corpus(lines: int = 4000) -> list[str]:
    """Chat-shaped English-like text and JSON, the same on every run."""
    rng = random.Random(SEED)
    vocab = WORDS.split()
    out = []
    for i in range(lines):
        words = [rng.choice(vocab) for _ in range(rng.randint(4, 14))]
        sentence = " ".join(words).capitalize() + rng.choice(PUNCT)
        if i % 5 == 0:
            args = {rng.choice(vocab): rng.choice([rng.choice(vocab), rng.randint(0, 999)])}
            call = {"name": f"{rng.choice(vocab)}_{rng.choice(vocab)}", "arguments": args}
            sentence += f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        role = rng.choice(["user", "assistant", "system"])
        out.append(f"<|im_start|>{role}\n{sentence}<|im_end|>\n")
    return out


def build(out: Path) -> None:
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,  # the smallest vLLM's CPU attention accepts
        max_position_embeddings=CONTEXT,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(out)


def logprobs(model_dir: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = []
    for ask in json.load(sys.stdin):
        prompt, completion = ask["prompt_ids"], ask["completion_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion[:-1]])).logits[0, len(prompt) - 1 :]
        scores = torch.log_softmax(logits.float(), dim=-1)
        picked = scores.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)
        answers.append([float(x) for x in picked])
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    command, target = sys.argv[1], Path(sys.argv[2])
    if command == "build":
        build(target)
    elif command == "logprobs":
        logprobs(target)
    else:
        sys.exit(f"vllm_model.py: unknown command {command!r}")
