"""The incremental engine: annotated deltas through one operator per plan node (paper Section 5).

Naming convention, after DBSP's (incremental operators carry the plain name; whatever works on whole collections
says so):

* ``process`` is an operator's incremental rule: the annotated delta(s) of its input(s) in, the annotated delta of
  its output out; a stateful operator folds the delta into its state on the way. Other functions that take or
  return changes end in ``_delta`` (``join_delta``, ``empty_delta``, ``PartialLayout.of_delta``) or are a pass
  (``Pipeline.maintain_pass``, which returns a ``SketchDelta``).
* Functions that take or return a *whole relation*, all current rows as one all-insert annotated frame (``Q(D)``),
  end in ``_relation`` (``output_relation``, ``relation_from_state``, ``CaptureBackend.relation``); the capture-time
  entry points (``Pipeline.capture``, ``bootstrap``) start from whole inputs.
* A function named after an operation alone computes it on whatever frames it is given, because it is the same on
  deltas and relations (``JoinOp.join_frames``: the join is bilinear).

See docs/ARCHITECTURE.md, "The incremental engine".
"""
