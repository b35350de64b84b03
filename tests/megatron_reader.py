#!/usr/bin/env python3
"""Megatron-LM's own indexed-dataset code (megatron-core), both ways, in one process (importing
torch and megatron takes seconds):

  megatron_reader.py JOBS.json

JOBS.json is a list of {"read": PREFIX} (read with Megatron's reader) and
{"write": PREFIX, "dtype": "uint16"|"int32", "docs": [[ids...], ...]} (write with Megatron's
builder). Prints, as the last line, a JSON list with one result per job: for a read its dtype,
sequence count, document indices and every document's ids; for a write the documents written.
"""
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy  # noqa: E402
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa: E402

with open(sys.argv[1]) as f:
    jobs = json.load(f)
results = []
for job in jobs:
    if "write" in job:
        b = IndexedDatasetBuilder(job["write"] + ".bin", dtype={"uint16": numpy.uint16, "int32": numpy.int32}[job["dtype"]])
        for d in job["docs"]:
            b.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
        b.finalize(job["write"] + ".idx")
        results.append({"written": len(job["docs"])})
    else:
        ds = IndexedDataset(job["read"])
        results.append({"dtype": str(ds.index.dtype.__name__), "sequences": len(ds),
                        "document_indices": ds.document_indices.tolist(),
                        "docs": [ds[int(i)].tolist() for i in range(len(ds))]})
print("\n" + json.dumps(results))
