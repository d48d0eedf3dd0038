"""Writes dcp_memoized.metadata (tests/unit/dcp_metadata_test.cc): a DCP
.metadata as a hostile writer would make it with torch 2.11's dataclasses and
Python's pickler, which memoizes shared objects: 10 tensors share one list of
20,000 references to a single ChunkStorageMetadata. About 100 KB of pickle
that expands to 200,000 chunks once its references are followed.

    .venv/bin/python tests/unit/data/make_dcp_memoized.py OUT_FILE
"""
import pickle
import sys

import torch
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, TensorProperties,
                                                   TensorStorageMetadata)

chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([1, 1]))
chunks = [chunk] * 20000
tensors = {f"model.w{i}": TensorStorageMetadata(properties=TensorProperties(dtype=torch.float32),
                                                 size=torch.Size([1, 1]), chunks=chunks) for i in range(10)}
with open(sys.argv[1], "wb") as f:
    pickle.dump(Metadata(state_dict_metadata=tensors, storage_data={}), f)
