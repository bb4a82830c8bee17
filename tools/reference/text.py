"""The prompt set, the training corpus and the tiny tokenizers.

Each tokenizer is trained on CORPUS through the normalizer and pre-tokenizer of the real one,
taken from the transformers class that the real repo names (Qwen2Tokenizer, CLIPTokenizer,
T5Tokenizer) or, for Tekken, built with the `tokenizers` library; the tokenizer is then that class
(or a `tokenizers` Tokenizer) with the learned vocabulary, so only the vocabulary is small. The
learning itself (BPE merges, Unigram pieces) is a small deterministic implementation here, since
the `tokenizers` trainers break ties in hash order and differ from run to run.
"""
import math
from collections import Counter

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AddedToken, CLIPTokenizer, Qwen2Tokenizer, T5Tokenizer

_ENGLISH = """\
A red fox jumps over a sleeping dog at the edge of a quiet forest.
The photograph shows a lighthouse on a rocky coast under a stormy sky, with waves breaking below.
A cat holding a sign that says hello world, studio lighting, sharp focus, high detail.
An astronaut rides a horse across a desert of orange sand while two moons rise behind the dunes.
A bowl of ripe fruit on a wooden table: apples, pears, grapes and a single lemon in soft morning light.
Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background.
You are an AI that reasons about image descriptions. You give structured responses focusing on object relationships, object attribution and actions without speculation.
A watercolor painting of a small village by a river, boats tied to the pier, children playing on the bridge.
Close-up portrait of an old fisherman with a grey beard, wrinkles, blue eyes, wearing a yellow raincoat.
The city at night: neon signs, wet streets reflecting the lights, people with umbrellas, taxis waiting.
A cozy library with tall shelves, a ladder, a reading chair, a sleeping cat and a cup of tea on the desk.
Minimalist poster with the word "SUMMER" in bold letters, a big orange sun and three blue waves.
Aerial view of green rice terraces on a mountain side, morning fog, a small red house in the middle.
It's a bright day; they'll walk, we're late, you've seen it, I'm sure, he'd agree.
Numbers and symbols: 0 1 2 3 4 5 6 7 8 9, 10%, $25.99, #42, a+b=c, (x, y), [1024x1024], 3.14159.
A robot painting a self-portrait in a sunlit studio, brushes, paint tubes, canvas, high resolution.
"""

_UNICODE = """\
東京の夜景、雨上がりの通りにネオンが映る。富士山と桜の写真。
一只红色的狐狸在雪地里奔跑，背景是高山和森林。夕阳下的长城。
서울의 밤거리, 카페 불빛과 사람들. 바다 위의 등대.
Café, naïve, résumé, façade, jalapeño, Ångström, Straße, œuvre, coöperate.
e\u0301 a\u0300 o\u0302 n\u0303 u\u0308 c\u0327 — combining marks: Z\u0351\u0320a\u0353l\u0316g\u0352o\u0315
Emoji: 🦊 🌃 🎨 🚀 🐱 🌸 ☀️ 🌊 👩‍🚀 👨‍👩‍👧 🏳️‍🌈 👍🏽 ✨🔥
Ελληνικά γράμματα, русский текст, עברית, العربية, हिन्दी, ไทย.
"""

CORPUS = [line for line in (_ENGLISH + _UNICODE).splitlines() if line]

# The prompt set every family tokenizes and encodes. "long" does not fit any family's maximum
# length (checked where it is used).
PROMPTS = {
    "ascii": "A red fox jumps over a sleeping dog, photographed at golden hour.",
    "unicode": "東京の夜景 🌃 with café lights, naïve e\u0301 art — 한국어 👩‍🚀 Z\u0351a\u0353lgo",
    "empty": "",
    "long": " ".join(_ENGLISH.split() * 4),
}
PROMPT_ORDER = ["ascii", "unicode", "empty", "long"]

# A reduced Qwen3 chat template: system/user/assistant turns and the generation prompt with the
# enable_thinking switch, written out as the real template renders them (no tools, no reasoning
# content in history).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
# The Qwen2.5-VL template for text-only messages: a default system turn when none is given.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen's added tokens in their real order after the byte-level vocabulary. <think> and </think>
# are added but not special, as in Qwen3.
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_PLAIN_ADDED = ["<think>", "</think>"]


def _byte_alphabet():
    """The 256 symbols of byte-level BPE in GPT-2 order: printable bytes as themselves, then the
    others mapped to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]


def _words(backend):
    """Counts of the pre-tokenized words of CORPUS, through the backend's normalizer and
    pre-tokenizer, in first-seen order."""
    counts = Counter()
    for line in CORPUS:
        if backend.normalizer is not None:
            line = backend.normalizer.normalize_str(line)
        for piece, _ in backend.pre_tokenizer.pre_tokenize_str(line):
            counts[piece] += 1
    return counts


def _learn_merges(words, count):
    """Greedy BPE on {symbol tuple: frequency}: each step merges the most frequent adjacent pair,
    ties going to the smaller pair. Done here rather than with the tokenizers trainer, which breaks
    ties in hash order and so learns a different merge order from run to run."""
    merges = []
    for _ in range(count):
        pairs = Counter()
        for word, frequency in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += frequency
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = {}
        for word, frequency in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + frequency
        words = merged
    return merges


def _bpe(backend, vocab_size, leading=(), word_end=""):
    """(vocab, merges) of a byte-level BPE: `leading` tokens first, then the byte alphabet (and,
    with a word-end suffix, the alphabet with the suffix), then each merge's result in order."""
    alphabet = _byte_alphabet()
    base = list(leading) + alphabet + ([a + word_end for a in alphabet] if word_end else [])
    words = {tuple(w[:-1]) + (w[-1] + word_end,): n for w, n in _words(backend).items()}
    merges = _learn_merges(words, vocab_size - len(base))
    tokens = dict.fromkeys(base + [a + b for a, b in merges])
    return {token: i for i, token in enumerate(tokens)}, merges


def _viterbi(word, scores, max_piece):
    """The best segmentation of `word` under the piece log-probabilities `scores`."""
    best = [0.0] + [-math.inf] * len(word)
    start_of = [0] * (len(word) + 1)
    for end in range(1, len(word) + 1):
        for start in range(max(0, end - max_piece), end):
            score = scores.get(word[start:end])
            if score is not None and best[start] + score > best[end]:
                best[end], start_of[end] = best[start] + score, start
    pieces, end = [], len(word)
    while end > 0:
        pieces.append(word[start_of[end]:end])
        end = start_of[end]
    return pieces[::-1]


def _unigram(words, size, max_piece=6, rounds=4):
    """A Unigram language model of `size` pieces over the metaspace words: every character, plus
    the substrings (up to max_piece characters, seen at least twice) that Viterbi segmentations
    keep using over a few rounds of hard EM. Returns (piece, log-probability) sorted by score, as
    SentencePiece orders them; ties go to the smaller string, so every run gives the same model."""
    chars = sorted({c for word in words for c in word})
    substrings = Counter()
    for word, n in words.items():
        for i in range(len(word)):
            for j in range(i + 2, min(len(word), i + max_piece) + 1):
                substrings[word[i:j]] += n
    budget = size - len(chars)
    ranked = sorted((p for p, n in substrings.items() if n >= 2), key=lambda p: (-substrings[p] * len(p), p))
    counts = {p: substrings[p] for p in ranked[:2 * budget]}
    for c in chars:
        counts[c] = 1 + sum(word.count(c) * n for word, n in words.items())
    for _ in range(rounds):
        total = sum(counts.values())
        scores = {p: math.log(n / total) for p, n in counts.items()}
        uses = Counter()
        for word, n in words.items():
            for piece in _viterbi(word, scores, max_piece):
                uses[piece] += n
        kept = sorted((p for p in uses if len(p) > 1), key=lambda p: (-uses[p], p))[:budget]
        counts = {p: uses[p] for p in kept}
        for c in chars:
            counts[c] = 1 + uses[c]  # every character stays, so nothing seen in the corpus is <unk>
    total = sum(counts.values())
    return sorted(((p, math.log(n / total)) for p, n in counts.items()), key=lambda ps: (-ps[1], ps[0]))


def qwen_tokenizer(chat_template, eos_token, vocab_size=640):
    """Qwen2 byte-level BPE (Qwen3 and Qwen2.5-VL use the same tokenizer)."""
    vocab, merges = _bpe(Qwen2Tokenizer().backend_tokenizer, vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, model_max_length=131072)
    tokenizer.add_tokens([AddedToken(t, special=True) for t in QWEN_SPECIAL[1:]], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_PLAIN_ADDED])
    tokenizer.eos_token = eos_token
    tokenizer.chat_template = chat_template
    assert tokenizer.convert_tokens_to_ids(QWEN_SPECIAL[0]) == len(vocab)
    return tokenizer


def clip_tokenizer(pad_token="<|endoftext|>", vocab_size=600):
    """CLIP BPE: lowercasing, CLIP's split regex, </w> word ends; the vocabulary ends with
    <|startoftext|> and <|endoftext|>, as the real one does."""
    vocab, merges = _bpe(CLIPTokenizer().backend_tokenizer, vocab_size - 2, word_end="</w>")
    for token in ("<|startoftext|>", "<|endoftext|>"):
        vocab[token] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)


def t5_tokenizer(vocab_size=500, extra_ids=100):
    """T5/UMT5 Unigram with Metaspace: <pad>=0, </s>=1, <unk>=2, then the pieces by score, then
    the <extra_id_N> sentinels in reverse order."""
    pieces = _unigram(_words(T5Tokenizer().backend_tokenizer), vocab_size - 3)
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids, model_max_length=512)


def long_prompt_check(token_count, max_length, family):
    if token_count <= max_length:
        raise SystemExit(f"{family}: the long prompt has {token_count} tokens, not more than {max_length}")


# Tekken (Mistral-Small-3.x, FLUX.2 dev): byte-level BPE without a normalizer, split by this
# pattern; the control tokens take the first ids, as in the real vocabulary (a reduced set here).
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
                  "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "<pad>"]
# The Mistral-Small-3.x template for system/user/assistant turns whose content is a string or a
# list of {"type": "text"} / {"type": "image"} items.
MISTRAL3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' }}{%- endif %}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'text' %}{{- item['text'] }}{%- elif item['type'] == 'image' %}{{- '[IMG]' }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- eos_token }}{%- endif %}"
    "{%- endfor %}"
)


def tekken_tokenizer(vocab_size=640):
    from tokenizers import Regex, decoders, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    vocab, merges = _bpe(backend, vocab_size, leading=TEKKEN_SPECIAL)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = backend.pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(TEKKEN_SPECIAL)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", TEKKEN_SPECIAL.index("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=131072)
