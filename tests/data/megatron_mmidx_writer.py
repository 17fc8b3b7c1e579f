#!/usr/bin/env python3
"""Writes PREFIX.bin and PREFIX.idx as Megatron's MMapIndexedDatasetBuilder does (megatron/data/
indexed_dataset.py, MMIDIDX version 1), with numpy only: an independent writer for keel's tests
of datasets "Megatron's tools wrote". Input: a JSON file {"vocab_size": V, "documents": [[id,
...], ...]}; the dtype is Megatron's best_fitting_dtype(V): uint16 below 65500, else int32.

usage: megatron_mmidx_writer.py DOCS.json PREFIX
"""
import json
import struct
import sys

import numpy as np

# megatron/data/indexed_dataset.py: dtypes = {1: uint8, 2: int8, 3: int16, 4: int32, 5: int64,
# 6: float, 7: double, 8: uint16}
CODES = {np.uint16: 8, np.int32: 4}


def main():
    spec = json.load(open(sys.argv[1]))
    prefix = sys.argv[2]
    dtype = np.uint16 if spec["vocab_size"] < 65500 else np.int32
    sizes = []
    with open(prefix + ".bin", "wb") as out:
        for doc in spec["documents"]:
            arr = np.array(doc, dtype=dtype)
            out.write(arr.tobytes(order="C"))
            sizes.append(arr.size)
    # _Writer.write: pointers are the byte offsets of each sequence; doc_idx 0..n (one sequence
    # per document, as preprocess_data.py without --split-sentences writes).
    itemsize = np.dtype(dtype).itemsize
    pointers, address = [], 0
    for size in sizes:
        pointers.append(address)
        address += size * itemsize
    doc_idx = list(range(len(sizes) + 1))
    with open(prefix + ".idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00")
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", CODES[dtype]))
        out.write(struct.pack("<Q", len(sizes)))
        out.write(struct.pack("<Q", len(doc_idx)))
        out.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
        out.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        out.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))


if __name__ == "__main__":
    main()
