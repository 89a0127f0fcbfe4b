"""The wheel tier: facts read from a release's published wheel, without installing or running it.

A wheel is downloaded with ``--no-deps`` semantics from the configured index, checked against the
sha256 the index states, unpacked into a content-addressed cache and read statically: FlashInfer's
and SGLang's own code at the lines that decide a feature, and the package metadata. No image, no
torch, no GPU. ``stackforge probe --tier wheel``, ``stackforge bisect`` and ``stackforge compat
verify`` are built on it.

Layout: :mod:`.model` (the contract between the parts), :mod:`.index` (releases and files from an
index), :mod:`.cache` (download, verify, unpack), :mod:`.readers` (one reader per feature),
:mod:`.tier` (readings -> result records), :mod:`.match` (which stacks a wheel record speaks for),
:mod:`.bisect`, :mod:`.verify` (rules against readings).
"""
