"""The exceptions tensorvm raises. Every message names what was expected and what came."""

from __future__ import annotations


class TensorVMError(Exception):
    """Base class of every error tensorvm raises on purpose."""


class ParseError(TensorVMError):
    """A syntax error in the text format; carries the position."""

    def __init__(self, message: str, line: int = 0, column: int = 0, source_name: str = "<string>"):
        self.line, self.column, self.source_name, self.bare_message = line, column, source_name, message
        super().__init__(f"{source_name}:{line}:{column}: {message}")


class TypeInferenceError(TensorVMError):
    """A program that does not type-check (a static conflict, an unknown name, ...)."""


class AttrError(TensorVMError):
    """An operator attribute that is unknown, missing or of the wrong kind."""


class ShapeError(TensorVMError):
    """A shape that is wrong at run time (a broadcast mismatch, a bad reshape, ...)."""


class UnsupportedError(TensorVMError):
    """Something tensorvm does not implement (an op, a construct on a given executor)."""


class ExecutionError(TensorVMError):
    """A failure while running a program (a Fatal, a kernel error, a bad argument)."""


class FormatError(TensorVMError):
    """A file that is truncated, corrupted or of the wrong version."""


class ModelImportError(FormatError):
    """A model from another framework (ONNX) that is malformed: a node with a missing or ill-typed
    attribute, the wrong number of inputs, an initializer whose data does not match its shape, ...
    The message names the node (its name and op type) and what was expected vs what came; a failure
    inside a converter keeps the original exception as ``__cause__``. (A well-formed model using
    something tensorvm lacks is an ``UnsupportedError``; a type conflict a ``TypeInferenceError``.)"""
