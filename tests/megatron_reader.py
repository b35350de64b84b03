#!/usr/bin/env python3
"""Reads an indexed dataset with Megatron-LM's own reader (megatron-core) and prints, as JSON,
its dtype and every document's token ids.   megatron_reader.py PREFIX"""
import json
import sys
import warnings

warnings.filterwarnings("ignore")
from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402

ds = IndexedDataset(sys.argv[1])
docs = [ds[int(i)].tolist() for i in range(len(ds))]
print("\n" + json.dumps({"dtype": str(ds.index.dtype.__name__), "sequences": len(ds),
                  "document_indices": ds.document_indices.tolist(), "docs": docs}))
