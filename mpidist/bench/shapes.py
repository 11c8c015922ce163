"""Gradient shapes of well-known models, generated from their architectures (no weights needed).

What a training step of these models reduces, for the fusion bench (``python -m mpidist bench
fusion``) and the per-step call-count test (tests/mpi/test_fusion_calls.py):

- :func:`resnet50`: the trainable weights of ``keras.applications.ResNet50(weights=None)``, in its
  order: 214 tensors, 25,583,592 parameters (102.3 MB in float32); ``conv_bias=False`` gives the 161
  of torchvision's ResNet-50 (convolutions without bias: 25,557,032 parameters), the count Horovod's
  papers quote. Checked against Keras 3.15 once, shape for shape. ``scale=k`` divides every width
  (the stages' 64 to 512 and their 4× outputs, the 1000 classes) by k, keeping the tensor count and
  order: about k² times fewer parameters.
- :func:`bert_base`: BERT-base's 199 weight tensors (embeddings, 12 encoder layers of 16 tensors,
  pooler): 109,482,240 parameters (438 MB in float32). ``scale=k`` divides the hidden size (768),
  the vocabulary (30522), the positions (512) and the feed-forward width (3072) by k, keeping the
  tensor count and structure: about k² times fewer parameters.
- :func:`small`: ``count`` tensors of ``size`` elements each (1000 × 1024: the per-tensor-cost case).
"""
from __future__ import annotations

from typing import Callable

Shape = tuple[int, ...]


def _conv_bn(shapes: list[Shape], k: int, cin: int, cout: int, conv_bias: bool) -> None:
    shapes.append((k, k, cin, cout))
    if conv_bias:
        shapes.append((cout,))
    shapes += [(cout,), (cout,)]


def resnet50(conv_bias: bool = True, scale: int = 1) -> list[Shape]:
    """The trainable weight shapes of ResNet-50 (see the module docstring), in the model's order;
    ``scale`` divides its widths."""
    shapes: list[Shape] = []
    _conv_bn(shapes, 7, 3, 64 // scale, conv_bias)
    cin = 64 // scale
    for width, blocks in ((64 // scale, 3), (128 // scale, 4), (256 // scale, 6), (512 // scale, 3)):
        for b in range(blocks):
            out = 4 * width
            if b == 0:  # the projection shortcut's conv comes before the block's third conv, BNs after both
                shortcut = [(1, 1, cin, out)] + ([(out,)] if conv_bias else [])
                shapes.append((1, 1, cin, width))
                if conv_bias:
                    shapes.append((width,))
                shapes += [(width,), (width,)]
                _conv_bn(shapes, 3, width, width, conv_bias)
                third = [(1, 1, width, out)] + ([(out,)] if conv_bias else [])
                shapes += shortcut + third + [(out,), (out,), (out,), (out,)]
            else:
                _conv_bn(shapes, 1, cin, width, conv_bias)
                _conv_bn(shapes, 3, width, width, conv_bias)
                _conv_bn(shapes, 1, width, out, conv_bias)
            cin = out
    classes = -(-1000 // scale)
    shapes += [(cin, classes), (classes,)]
    return shapes


def bert_base(scale: int = 1) -> list[Shape]:
    """The weight shapes of BERT-base (see the module docstring); ``scale`` divides its widths."""
    hidden, vocab, positions, ffn = 768 // scale, -(-30522 // scale), 512 // scale, 3072 // scale
    shapes: list[Shape] = [(vocab, hidden), (positions, hidden), (2, hidden), (hidden,), (hidden,)]
    for _ in range(12):
        for _ in range(4):  # query, key, value, attention output
            shapes += [(hidden, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,)]  # attention layer norm
        shapes += [(hidden, ffn), (ffn,), (ffn, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,)]  # output layer norm
    shapes += [(hidden, hidden), (hidden,)]  # pooler
    return shapes


def small(count: int = 1000, size: int = 1024) -> list[Shape]:
    """``count`` tensors of ``size`` elements."""
    return [(size,)] * count


MODELS: dict[str, Callable[..., list[Shape]]] = {"resnet50": resnet50, "bert_base": bert_base, "small": small}
