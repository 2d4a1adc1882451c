"""The records store: append-only JSONL per arm, read with exactly-once rules, safe for concurrent writers.

- `schema`: the one validation of a record (writer, reader, check and repair),
- `codec`: canonical JSON, fingerprints, the streaming line scanner (a bad line names file:line and is set aside),
- `reader`: `read_arm` / `Selection`, the one place that decides which records count,
- `claims`: O_EXCL claim files so two writers never do the same (sample, repeat),
- `store`: `ArmStore`, the writer (primary file or a per-writer segment, group commit),
- `__main__`: `python -m fp8eval.records check|repair PATH...`.
"""

from fp8eval.records.codec import RECORD_SCHEMA, LineProblem, canonical_json, fingerprint_hash
from fp8eval.records.reader import DONE_STATUSES, ArmRecords, arm_files, read_arm, read_records, select_arm
from fp8eval.records.store import ArmStore, iter_arm_files, repair_torn_tail

__all__ = ["RECORD_SCHEMA", "LineProblem", "canonical_json", "fingerprint_hash", "DONE_STATUSES",
           "ArmRecords", "arm_files", "read_arm", "read_records", "select_arm", "ArmStore", "iter_arm_files",
           "repair_torn_tail"]
