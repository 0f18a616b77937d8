"""A tiny recurrent text model with control flow: a Loop over the words, an If inside it.

    python examples/sequence_model.py

The model (built here with onnx.helper) reads a sentence as word ids and, word by word, updates a
hidden state h = tanh(h @ W + E[word]) inside a Loop body. An If skips padding words (id 0) and
leaves h unchanged; the loop's condition stops it right after the end-of-sentence word (id 1), so
the trip count depends on the data. The graph returns every intermediate state (a Loop scan
output), the final state, and a score sigmoid(h @ w). The script runs it with onnx_mini on a few
sentences and checks every number against the same recurrence written in numpy.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper

import onnx_mini

VOCAB = ["<pad>", "<end>", "the", "film", "was", "not", "good", "great", "boring", "really", "at", "all"]
HIDDEN = 4
PAD, END = 0, 1


def weights(seed: int = 3):
    rng = np.random.default_rng(seed)
    E = rng.normal(0, 0.8, size=(len(VOCAB), HIDDEN)).astype(np.float32)    # word embeddings
    W = rng.normal(0, 0.5, size=(HIDDEN, HIDDEN)).astype(np.float32)         # recurrence
    w = rng.normal(0, 1.0, size=(HIDDEN, 1)).astype(np.float32)              # score head
    return E, W, w


def build_model():
    E, W, w = weights()
    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    scalar = lambda name, t: helper.make_tensor_value_info(name, t, [])      # noqa: E731

    # If branches: no inputs of their own; they read h_in and word from the enclosing body.
    keep = helper.make_graph([helper.make_node("Identity", ["h_in"], ["h_kept"])], "keep_state", [],
                             [helper.make_tensor_value_info("h_kept", F, [HIDDEN])])
    update = helper.make_graph(
        [helper.make_node("Gather", ["E", "word"], ["embedded"], axis=0),
         helper.make_node("MatMul", ["h_in", "W"], ["recurrent"]),
         helper.make_node("Add", ["recurrent", "embedded"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_new"])],
        "update_state", [], [helper.make_tensor_value_info("h_new", F, [HIDDEN])])

    # Loop body: (iteration, condition, h) -> (continue?, h, h as a scan output)
    body = helper.make_graph(
        [helper.make_node("Gather", ["words", "i"], ["word"], axis=0),
         helper.make_node("Equal", ["word", "pad_id"], ["is_pad"]),
         helper.make_node("If", ["is_pad"], ["h_out"], then_branch=keep, else_branch=update),
         helper.make_node("Equal", ["word", "end_id"], ["is_end"]),
         helper.make_node("Not", ["is_end"], ["go_on"]),
         helper.make_node("Identity", ["h_out"], ["h_step"])],
        "read_word",
        [scalar("i", I64), scalar("cond_in", B), helper.make_tensor_value_info("h_in", F, [HIDDEN])],
        [scalar("go_on", B), helper.make_tensor_value_info("h_out", F, [HIDDEN]),
         helper.make_tensor_value_info("h_step", F, [HIDDEN])])

    graph = helper.make_graph(
        [helper.make_node("Shape", ["words"], ["n_words"]),
         helper.make_node("Squeeze", ["n_words"], ["max_trips"]),
         helper.make_node("Loop", ["max_trips", "true", "h0"], ["h_final", "states"], body=body, name="over_words"),
         helper.make_node("MatMul", ["h_final", "w"], ["logit"]),
         helper.make_node("Sigmoid", ["logit"], ["score"])],
        "tiny_rnn",
        [helper.make_tensor_value_info("words", I64, ["n"])],
        [helper.make_tensor_value_info("score", F, [1]),
         helper.make_tensor_value_info("h_final", F, [HIDDEN]),
         helper.make_tensor_value_info("states", F, ["steps", HIDDEN])],
        [numpy_helper.from_array(a, name) for name, a in (
            ("E", E), ("W", W), ("w", w), ("h0", np.zeros(HIDDEN, np.float32)),
            ("true", np.array(True)), ("pad_id", np.array(PAD, np.int64)), ("end_id", np.array(END, np.int64)))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    checker.check_model(model, full_check=True)
    return model


def numpy_reference(words: np.ndarray):
    """The same recurrence, written directly."""
    E, W, w = weights()
    h, states = np.zeros(HIDDEN, np.float32), []
    for word in words:
        if word != PAD:
            h = np.tanh(h @ W + E[word])
        states.append(h)
        if word == END:
            break
    score = 1 / (1 + np.exp(-(h @ w)))
    return score, h, np.array(states, np.float32).reshape(-1, HIDDEN)


def encode(sentence: str) -> np.ndarray:
    return np.array([VOCAB.index(t) for t in sentence.split()], np.int64)


def main() -> None:
    model = onnx_mini.prepare(build_model())
    sentences = ["the film was great <end>",
                 "the film was not good at all <end> <pad> <pad>",
                 "really <pad> boring <end> the film was great"]    # stops at <end>: the rest is never read
    print(f"tiny recurrent model: Loop over the words, If for padding ({len(model.plan.steps)} top-level steps)")
    for sentence in sentences:
        words = encode(sentence)
        score, h_final, states = model.run({"words": words})
        ref_score, ref_h, ref_states = numpy_reference(words)
        assert states.shape == ref_states.shape, (states.shape, ref_states.shape)
        np.testing.assert_allclose(states, ref_states, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h_final, ref_h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(score, ref_score, rtol=1e-5, atol=1e-6)
        print(f"  {sentence!r}: {len(words)} words, {len(states)} read, score {float(score[0]):.4f}")
    print("checked against numpy: states, final state and scores agree")


if __name__ == "__main__":
    main()
