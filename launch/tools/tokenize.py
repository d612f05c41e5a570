#!/usr/bin/env python3
"""Turn text into fathom token shards (DESIGN 4).

Reads .txt, .md, .jsonl and .parquet inputs, encodes every document with a Hugging Face
tokenizer.json, appends the end-of-text (EOT) id after each document, and writes
DIR/shard_00000.h5, DIR/shard_00001.h5, ...: each an HDF5 file with a 1-D uint32 dataset
/tokens and root attributes vocab_size, eot_id and tokenizer (the tokenizer file's name).

Documents:
  .txt .md  the whole file is one document
  .jsonl    one JSON object per line; the document is its --text-field (default "text")
  .parquet  one row per document, column --text-field (needs pyarrow)
Empty documents are skipped. Inputs are read in the order given; shards hold exactly
--shard-tokens tokens except the last, and a document may continue into the next shard
(fathom packs windows across shard boundaries).

launch/tools/bytes_tokenizer.json is a byte-level tokenizer (ids 0..255 are the bytes of
the UTF-8 text, 256 is <|endoftext|>) to try the shards path without downloading one.

Exit codes: 0 done, 2 bad arguments or unreadable inputs, 3 malformed input content.
"""

# This file is named like the standard library's `tokenize` module, which the standard
# library itself imports (inspect, linecache). Drop this script's folder from the import
# path before anything else is imported, so those imports find the real module.
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

try:
    import h5py  # noqa: E402
    import numpy  # noqa: E402
    from tokenizers import Tokenizer  # noqa: E402
except ImportError as missing:
    print(f"tokenize.py: error: the Python module {missing.name} is missing: "
          "pip install tokenizers h5py numpy", file=sys.stderr)
    sys.exit(2)

DEFAULT_SHARD_TOKENS = 1 << 27  # 512 MiB of uint32 per shard
DEFAULT_EOT_TOKENS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
ENCODE_BATCH = 1024  # documents encoded together (the tokenizer parallelises a batch)
PROGRESS_SECONDS = 5.0


def fail(code, message):
    print(f"tokenize.py: error: {message}", file=sys.stderr)
    sys.exit(code)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="tokenize.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer.json")
    parser.add_argument("--output", required=True, help="directory for shard_NNNNN.h5")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                        help=f"tokens per shard (default {DEFAULT_SHARD_TOKENS})")
    eot = parser.add_mutually_exclusive_group()
    eot.add_argument("--eot-token", help="the EOT token's text (default: the first of "
                     + ", ".join(DEFAULT_EOT_TOKENS) + " that the tokenizer knows)")
    eot.add_argument("--eot-id", type=int, help="the EOT token's id")
    parser.add_argument("--text-field", default="text",
                        help="the .jsonl field / .parquet column holding the text")
    parser.add_argument("--add-special-tokens", action="store_true",
                        help="let the tokenizer add its special tokens (e.g. BOS) to each "
                        "document (default: off; documents are separated by EOT only)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace shard_*.h5 files already in the output directory")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help=".txt, .md, .jsonl or .parquet files")
    arguments = parser.parse_args(argv)
    if arguments.shard_tokens < 1:
        fail(2, f"--shard-tokens must be at least 1, got {arguments.shard_tokens}")
    if not os.path.isfile(arguments.tokenizer):
        fail(2, f"tokenizer file {arguments.tokenizer} does not exist")
    for path in arguments.inputs:
        if not os.path.isfile(path):
            fail(2, f"input file {path} does not exist")
        if input_kind(path) is None:
            fail(2, f"input {path}: unknown extension (expected .txt, .md, .jsonl or "
                 ".parquet)")
    return arguments


def input_kind(path):
    for kind in ("txt", "md", "jsonl", "parquet"):
        if path.endswith("." + kind):
            return kind
    return None


def read_txt(path, field):
    with open(path, encoding="utf-8") as file:
        yield file.read()


def read_jsonl(path, field):
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                fail(3, f"{path}:{number}: not valid JSON: {error}")
            if not isinstance(record, dict) or field not in record:
                fail(3, f"{path}:{number}: no \"{field}\" field (choose it with --text-field)")
            if not isinstance(record[field], str):
                fail(3, f"{path}:{number}: the \"{field}\" field is not a string")
            yield record[field]


def read_parquet(path, field):
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        fail(2, f"reading {path} needs pyarrow: pip install pyarrow")
    table = parquet.ParquetFile(path)
    if field not in table.schema_arrow.names:
        fail(3, f"{path}: no \"{field}\" column (choose it with --text-field)")
    for batch in table.iter_batches(columns=[field]):
        for text in batch.column(0).to_pylist():
            if text is not None and not isinstance(text, str):
                fail(3, f"{path}: the \"{field}\" column does not hold strings")
            yield text


READERS = {"txt": read_txt, "md": read_txt, "jsonl": read_jsonl, "parquet": read_parquet}


def documents(inputs, field):
    """Yields (document text, input path) in input order, empty documents skipped."""
    for path in inputs:
        try:
            for text in READERS[input_kind(path)](path, field):
                if text:
                    yield text, path
        except UnicodeDecodeError as error:
            fail(3, f"{path} is not UTF-8 text: {error}")
        except OSError as error:
            fail(2, f"cannot read {path}: {error.strerror}")


def resolve_eot_id(tokenizer, arguments, vocab_size):
    if arguments.eot_id is not None:
        if not 0 <= arguments.eot_id < vocab_size:
            fail(2, f"--eot-id {arguments.eot_id} is outside the tokenizer's vocab "
                 f"(size {vocab_size})")
        return arguments.eot_id
    candidates = [arguments.eot_token] if arguments.eot_token else DEFAULT_EOT_TOKENS
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    fail(2, f"the tokenizer {arguments.tokenizer} has no token "
         + " or ".join(repr(t) for t in candidates) + "; name the EOT with --eot-token or "
         "--eot-id")


class ShardWriter:
    """Collects token ids and writes them out in shards of exactly shard_tokens ids."""

    def __init__(self, directory, shard_tokens, attributes):
        self.directory, self.shard_tokens, self.attributes = directory, shard_tokens, attributes
        self.pending, self.pending_count = [], 0
        self.shards_written = self.tokens_written = 0

    def add(self, ids):
        self.pending.append(numpy.asarray(ids, dtype=numpy.uint32))
        self.pending_count += len(ids)
        while self.pending_count >= self.shard_tokens:
            joined = numpy.concatenate(self.pending)
            self.write_shard(joined[:self.shard_tokens])
            rest = joined[self.shard_tokens:]
            self.pending, self.pending_count = [rest], len(rest)

    def finish(self):
        if self.pending_count:
            self.write_shard(numpy.concatenate(self.pending))
        self.pending, self.pending_count = [], 0

    def write_shard(self, tokens):
        path = os.path.join(self.directory, f"shard_{self.shards_written:05d}.h5")
        temporary = path + ".tmp"  # renamed once complete: a crash leaves no half shard
        with h5py.File(temporary, "w") as file:
            file.create_dataset("tokens", data=tokens, dtype=numpy.uint32)
            for name, value in self.attributes.items():
                file.attrs[name] = value
        os.replace(temporary, path)
        self.shards_written += 1
        self.tokens_written += len(tokens)


def prepare_output(directory, overwrite):
    if os.path.exists(directory) and not os.path.isdir(directory):
        fail(2, f"--output {directory} is a file; it must name a directory for the shards")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        fail(2, f"cannot make the output directory {directory}: {error.strerror}")
    existing = sorted(name for name in os.listdir(directory)
                      if name.startswith("shard_") and name.endswith(".h5"))
    if existing and not overwrite:
        fail(2, f"{directory} already holds {len(existing)} shard(s) ({existing[0]}, ...); "
             "remove them or pass --overwrite")
    for name in existing:
        os.remove(os.path.join(directory, name))


def batches(items, size):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def main(argv):
    arguments = parse_arguments(argv)
    try:
        tokenizer = Tokenizer.from_file(arguments.tokenizer)
    except Exception as error:  # the library raises plain Exception for a bad file
        fail(2, f"cannot load tokenizer {arguments.tokenizer}: {error}")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eot_id = resolve_eot_id(tokenizer, arguments, vocab_size)
    prepare_output(arguments.output, arguments.overwrite)
    writer = ShardWriter(arguments.output, arguments.shard_tokens, {
        "vocab_size": vocab_size,
        "eot_id": eot_id,
        "tokenizer": os.path.basename(arguments.tokenizer),
    })
    started = last_report = time.monotonic()
    document_count = 0
    for batch in batches(documents(arguments.inputs, arguments.text_field), ENCODE_BATCH):
        encodings = tokenizer.encode_batch([text for text, _ in batch],
                                           add_special_tokens=arguments.add_special_tokens)
        for encoding in encodings:
            writer.add(encoding.ids + [eot_id])
        document_count += len(batch)
        now = time.monotonic()
        if now - last_report >= PROGRESS_SECONDS:
            last_report = now
            tokens = writer.tokens_written + writer.pending_count
            print(f"tokenize.py: {document_count} documents, {tokens} tokens, "
                  f"{tokens / (now - started):.0f} tokens/s, reading {batch[-1][1]}",
                  file=sys.stderr)
    writer.finish()
    print(f"tokenize.py: wrote {writer.tokens_written} tokens from {document_count} documents "
          f"into {writer.shards_written} shard(s) in {arguments.output} "
          f"(vocab_size {vocab_size}, eot_id {eot_id})", file=sys.stderr)
    print(f"tokenize.py: train on them with --set model.vocab_size=auto (reads {vocab_size} "
          f"from the shards) --set data.source=shards --set data.train={arguments.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
