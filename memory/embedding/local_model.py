"""all-MiniLM-L6-v2 run with ONNX Runtime: the bundled weights, without torch.

sentence-transformers has a fixed overhead on every call that is most of a recall's time when the
call embeds one short question. This runs the same network (a 6-layer BERT
encoder, mean pooling over the real tokens, unit length) on the same files: the tokenizer from
`tokenizer.json` with the `tokenizers` package, the weights from `model.safetensors`. No exported
model file is shipped or downloaded: the network is written here as an ONNX graph (`onnx`'s helpers)
whose weights are references into `model.safetensors`, and ONNX Runtime runs it, with its own
kernels for the matrix products, layer norms and GELU. `python -m bench.embedder` checks that its
vectors are the sentence-transformers ones (cosine >= 0.999) and measures both (bench/README.md
holds the current figures).

Memory: ONNX Runtime reads the encoder's weights from the file itself, and the embedding tables are
mapped from it, so they are the system's page cache, shared by every process that loads the model,
and only the rows of words that occur are read: a process pays for the weights once per machine,
not once per process (`python -m bench.embedder` prints `engram_process_mb`). The rows read are let
go of every RELEASE_AFTER_ROWS rows (the pages stay in the page cache): kept mapped, every word a process
ever met stayed in its resident memory, up to the whole 45 MB table, which is more than the size
the process measured for the model when it loaded (memory.embedding.embedder.model_resident_bytes).
"""

import json
import mmap
import struct

import numpy as np

# sentence-transformers' max_seq_length for this model (sentence_bert_config.json): longer texts are
# cut there, as it cuts them (recall embeds long texts in pieces, memory.embedding.embedder.split_pieces).
MAX_TOKENS = 256
BATCH = 32  # texts per forward pass, grouped by length so that little padding is computed
# A forward pass's fixed cost (its operators' calls, the tokens' lookup) in tokens of one row's work:
# one short text alone takes about as long as eight more tokens in a pass with others (this machine's
# ONNX Runtime, one thread: about 1 ms, and 0.2 ms a token).
PASS_TOKENS = 8
LAYERS, HEADS, EPSILON = 6, 12, 1e-12  # the model's config.json
OPSET = 20  # the first with a Gelu operator (exact, erf-based: "gelu" in the model's config)
WEIGHTS_FILE = "model.safetensors"
# Word-table rows a process reads before it lets go of the pages they mapped (MiniLM.release_rows): at
# most a page each, so at most 2 MB stay resident beyond the model's measure, while a short question
# (a dozen rows) pays for the release once in about forty calls rather than on each.
RELEASE_AFTER_ROWS = 512


def safetensors_layout(path):
    """{name: (shape, offset in the file, bytes)} of the float32 tensors of a safetensors file.

    The format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header giving
    each tensor's dtype, shape and [start, end) in the data after it. The `safetensors` package reads
    tensors into memory; ONNX Runtime and a mapping of the file need where they are instead.
    """
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    layout = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":  # BERT's position_ids (int64) are not weights
            continue
        start, end = info["data_offsets"]
        layout[name] = (tuple(info["shape"]), 8 + length + start, end - start)
    return layout


def encoder_graph(layout):
    """The encoder and its pooling as an ONNX model: the tokens' embeddings (batch x length x 384,
    float32: word + position + token type, before their layer norm) and the mask (batch x length,
    int64) in, unit vectors (batch x 384, float32) out. The weights are references into WEIGHTS_FILE
    (`layout`: safetensors_layout), which ONNX Runtime reads from the model's folder.

    Each linear layer is one Gemm over the batch's tokens flattened to rows, with the weight as
    stored (torch's Linear keeps out x in: transB) and its bias: no transposed copy of a weight, and
    a tenth faster than MatMul then Add on 3-d inputs. The embeddings' lookup stays outside: the
    word table is half the weights, and most of its rows are never read.
    """
    from onnx import TensorProto, helper, numpy_helper

    initializers, nodes = [], []

    def weight(name):
        shape, offset, size = layout[name]
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS_FILE), ("offset", offset), ("length", size)):
            tensor.external_data.add(key=key, value=str(value))
        initializers.append(tensor)
        return name

    def const(name, array):
        initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(kind, *inputs, **attributes):
        name = f"{kind}_{len(nodes)}"
        nodes.append(helper.make_node(kind, list(inputs), [name], **attributes))
        return name

    def ints(name, values):
        return const(name, np.array(values, dtype=np.int64))

    def scalar(name, value):
        return const(name, np.array(value, dtype=np.float32))

    def dense(rows, prefix):
        return op("Gemm", rows, weight(prefix + ".weight"), weight(prefix + ".bias"), transB=1)

    def layer_norm(x, prefix):
        return op(
            "LayerNormalization", x, weight(prefix + ".weight"), weight(prefix + ".bias"), axis=-1, epsilon=EPSILON
        )

    width = layout["embeddings.word_embeddings.weight"][0][1]
    head_width = width // HEADS
    tokens_shape = op("Shape", "token_embeddings")  # batch, length, width
    heads_shape = op("Concat", op("Shape", "token_embeddings", end=2), ints("heads", [HEADS, head_width]), axis=0)
    as_rows = ints("as_rows", [-1, width])  # (batch x length) x width: one row per token
    rows = op("Reshape", layer_norm("token_embeddings", "embeddings.LayerNorm"), as_rows)
    mask = op("Cast", "attention_mask", to=TensorProto.FLOAT)
    # Padding keys get a large negative score (batch x 1 x 1 x length), so softmax gives them no weight.
    key_bias = op("Mul", op("Sub", scalar("one", 1.0), mask), scalar("minus_large", -1e9))
    key_bias = op("Unsqueeze", key_bias, ints("head_axes", [1, 2]))
    scale = scalar("scale", 1.0 / np.sqrt(head_width))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (
            op("Transpose", op("Reshape", dense(rows, p + f"attention.self.{name}"), heads_shape), perm=[0, 2, 1, 3])
            for name in ("query", "key", "value")
        )
        scores = op("Add", op("Mul", op("MatMul", q, op("Transpose", k, perm=[0, 1, 3, 2])), scale), key_bias)
        context = op("MatMul", op("Softmax", scores, axis=-1), v)
        context = op("Reshape", op("Transpose", context, perm=[0, 2, 1, 3]), as_rows)
        rows = layer_norm(
            op("Add", rows, dense(context, p + "attention.output.dense")), p + "attention.output.LayerNorm"
        )
        hidden = op("Gelu", dense(rows, p + "intermediate.dense"))
        rows = layer_norm(op("Add", rows, dense(hidden, p + "output.dense")), p + "output.LayerNorm")
    # Mean over the real tokens, then unit length (the model's Pooling and Normalize modules).
    x = op("Reshape", rows, tokens_shape)
    sequence = ints("sequence", [1])
    summed = op("ReduceSum", op("Mul", x, op("Unsqueeze", mask, ints("token_axis", [2]))), sequence, keepdims=0)
    count = op("Max", op("ReduceSum", mask, sequence, keepdims=1), scalar("tiny", 1e-9))
    pooled = op("Div", summed, count)
    norm = op("Max", op("ReduceL2", pooled, ints("vector", [1]), keepdims=1), scalar("tinier", 1e-12))
    nodes.append(helper.make_node("Div", [pooled, norm], ["embedding"]))
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["batch", "length", width]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        initializers,
    )
    # IR version 9: what opset 20 needs, and what ONNX Runtime has read since 1.16.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def length_batches(lengths):
    """The indexes of texts of these token counts as forward passes: shortest first, at most BATCH
    texts each, and a new pass wherever padding the texts so far to the next one's length would cost
    more than a pass of its own (PASS_TOKENS).

    Every row of a pass is computed to its longest text's length: the embedding worker's batches mix
    a fact's few words with an episode's lines, and padded to the episodes the facts cost as much as
    they do (a fact and an episode of the demo workflow, three of each: a third more than two passes).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches, batch = [], []
    for i in order:
        if batch and (len(batch) >= BATCH or len(batch) * (lengths[i] - lengths[batch[-1]]) > PASS_TOKENS):
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


class MiniLM:
    """The encoder and its tokenizer, loaded from a sentence-transformers model folder.

    `threads`: ONNX Runtime's threads for one forward pass. Idle ones sleep at once instead of
    spinning: a spinning thread, even in a process at nice 19, delays every wake-up of the others.
    `prepack`: ONNX Runtime's own copies of the weights laid out for its matrix products, about 40 MB
    of the process's memory. Without them it reads the weights where they are mapped from the file
    (page cache, shared by every process of the machine): batches of documents take about as long, one short
    question about a tenth longer (a task worker embeds no questions: memory.embedding.embedder).
    """

    def __init__(self, folder, threads=1, prepack=True):
        import onnxruntime
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()  # the file pads to a fixed length; batches here pad to their longest
        self.tokenizer.enable_truncation(MAX_TOKENS)
        path = folder / WEIGHTS_FILE
        layout = safetensors_layout(path)
        with open(path, "rb") as file:
            self._mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._rows_read = 0  # word-table rows read since the last release_rows

        def table(name):
            shape, offset, size = layout[name]
            return np.frombuffer(self._mapped, dtype=np.float32, count=size // 4, offset=offset).reshape(shape)

        self.words = table("embeddings.word_embeddings.weight")
        self.positions = table("embeddings.position_embeddings.weight")
        self.token_type = np.array(table("embeddings.token_type_embeddings.weight")[0])
        self.dimension = self.words.shape[1]
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        # No memory arena for a call's activations: it would keep the largest batch's buffers for
        # good, and gains no speed here. What they free goes back to the system when a model child
        # idles (memory/embedding/model_process.py).
        options.enable_cpu_mem_arena = False
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        # Where the graph's weight references point: the model's folder (the graph comes as bytes).
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        self._session = onnxruntime.InferenceSession(
            encoder_graph(layout).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def encode(self, texts):
        """Unit vectors (len(texts) x 384, float32), in the order of `texts`."""
        encodings = self.tokenizer.encode_batch(list(texts))
        self._rows_read += sum(len(e.ids) for e in encodings)
        out = np.zeros((len(encodings), self.dimension), dtype=np.float32)
        for batch in length_batches([len(e.ids) for e in encodings]):
            length = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), length), dtype=np.int64)
            mask = np.zeros((len(batch), length), dtype=np.int64)
            for row, i in enumerate(batch):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            tokens = self.words[ids] + self.positions[:length] + self.token_type
            out[batch] = self._session.run(None, {"token_embeddings": tokens, "attention_mask": mask})[0]
        if self._rows_read >= RELEASE_AFTER_ROWS:
            self.release_rows()
        return out

    def release_rows(self):
        """Unmap the pages of the embedding tables' rows read so far from this process (the next call
        maps those it reads again, from the page cache: the same bytes). Nothing where the system
        has no such advice."""
        self._rows_read = 0
        if hasattr(mmap, "MADV_DONTNEED"):
            self._mapped.madvise(mmap.MADV_DONTNEED)
