"""The op recorder shared by the model front ends (trainsim.nn, torch.fx): symbolic tensors, op
constructors with the zoo's conventions (`ops`), and the grouping of ops into layers."""

from __future__ import annotations

from .builder import GraphBuilder, ModuleInfo, OpRecord
from .tensor import CONST, INPUT, PARAM, ParamRef, SymTensor

__all__ = ["CONST", "INPUT", "PARAM", "GraphBuilder", "ModuleInfo", "OpRecord", "ParamRef", "SymTensor"]
