"""all-MiniLM-L6-v2 run with numpy: the bundled weights, without torch at run time.

sentence-transformers spends ~15 ms of fixed overhead on every call on this machine, most of a
recall's time when the call embeds one short question; the model's own arithmetic for such a text is
about a millisecond. This runs the same network (a 6-layer BERT encoder, mean pooling over the real
tokens, unit length) on the same files: the tokenizer from `tokenizer.json` with the `tokenizers`
package, the weights from `model.safetensors` with `safetensors`. `bench.embedder` checks that its
vectors are the sentence-transformers ones (cosine >= 0.999) and measures both.
"""

import numpy as np

# sentence-transformers' max_seq_length for this model (sentence_bert_config.json): longer texts are
# cut there, as it cuts them (recall embeds long texts in pieces, memory.embeddings.split_pieces).
MAX_TOKENS = 256
BATCH = 32  # texts per forward pass, grouped by length so that little padding is computed
FEED_FORWARD_ROWS = 128  # token rows per block of the feed-forward layer: 128 x 1536 float32 is 768 KB


def _gelu_(x):
    """BERT's exact GELU ("gelu" in the model's config, not the tanh approximation), in place.

    numpy has no erf: Abramowitz & Stegun 7.1.26, exact to 1.5e-7, below float32's own rounding.
    In place, on a block that fits the CPU's cache: elementwise passes over the whole batch's
    intermediate layer cost more than its matrix products.
    """
    z = np.abs(x) * np.float32(0.7071067811865476)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * z)
    poly = np.float32(1.061405429) * t
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt 2)
    # gelu(x) = x * (1 + erf(x / sqrt 2)) / 2 = max(x, 0) - |x| * (1 - erf(|x| / sqrt 2)) / 2
    poly *= np.abs(x)
    poly *= np.float32(0.5)
    np.maximum(x, np.float32(0.0), out=x)
    x -= poly
    return x


def _linear(x, weight, bias):
    """x @ weight.T + bias over the last axis, with `weight` (out x in) as the model stores it.

    Computed as (weight @ x.T).T: OpenBLAS multiplies token rows by the weight as stored faster
    than by a transposed copy (x @ W): for the 384 x 1536 layer and 10 rows, 233 against 390 us.
    `python -m bench.embedder`: 72.5-74.9 documents/s against 64.5, the same vectors. One question
    stays at about 9.6 ms: it is bound by reading the six layers' 42 MB of weights, not by the
    arithmetic. The result is a transposed view; callers that reshape it get a contiguous copy."""
    rows = x.reshape(-1, x.shape[-1])
    out = (weight @ rows.T).T
    out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _layer_norm(x, weight, bias, eps=1e-12):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias


class MiniLM:
    """The encoder and its tokenizer, loaded from a sentence-transformers model folder."""

    def __init__(self, folder):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        w = load_file(str(folder / "model.safetensors"))
        self.heads = 12
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.embedding_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(6):
            p = f"encoder.layer.{i}."

            def dense(name, p=p):  # weights as stored: (out x in), for _linear
                return np.ascontiguousarray(w[p + name + ".weight"]), w[p + name + ".bias"]

            q, k, v = (dense(f"attention.self.{n}") for n in ("query", "key", "value"))
            self.layers.append(
                {
                    "qkv": (np.concatenate([q[0], k[0], v[0]], axis=0), np.concatenate([q[1], k[1], v[1]])),
                    "attention_out": dense("attention.output.dense"),
                    "attention_norm": (
                        w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"],
                    ),
                    "intermediate": dense("intermediate.dense"),
                    "out": dense("output.dense"),
                    "out_norm": (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
                }
            )
        self.dimension = self.word.shape[1]

    def encode(self, texts):
        """Unit vectors (len(texts) x 384, float32), in the order of `texts`."""
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(encodings), self.dimension), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            length = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), length), dtype=np.int64)
            mask = np.zeros((len(batch), length), dtype=np.float32)
            for row, i in enumerate(batch):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1.0
            out[batch] = self._forward(ids, mask)
        return out

    def _feed_forward(self, x, layer):
        """The intermediate layer and its output, a block of token rows at a time (cache-sized)."""
        rows = x.reshape(-1, self.dimension)
        out = np.empty_like(rows)
        (w_in, b_in), (w_out, b_out) = layer["intermediate"], layer["out"]
        for start in range(0, len(rows), FEED_FORWARD_ROWS):
            block = _linear(rows[start : start + FEED_FORWARD_ROWS], w_in, b_in)
            out[start : start + FEED_FORWARD_ROWS] = _linear(_gelu_(block), w_out, b_out)
        return out.reshape(x.shape)

    def _forward(self, ids, mask):
        batch, length = ids.shape
        heads, width = self.heads, self.dimension // self.heads
        x = self.word[ids] + self.position[:length] + self.token_type
        x = _layer_norm(x, *self.embedding_norm)
        # Padding keys get a large negative score, so softmax gives them no weight.
        key_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(width))
        for layer in self.layers:
            qkv = _linear(x, *layer["qkv"])
            q, k, v = (
                qkv[..., j * self.dimension : (j + 1) * self.dimension]
                .reshape(batch, length, heads, width)
                .transpose(0, 2, 1, 3)
                for j in range(3)
            )
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dimension)
            attended = _linear(context, *layer["attention_out"])
            x = _layer_norm(x + attended, *layer["attention_norm"])
            x = _layer_norm(x + self._feed_forward(x, layer), *layer["out_norm"])
        # Mean over the real tokens, then unit length (the model's Pooling and Normalize modules).
        pooled = (x * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
