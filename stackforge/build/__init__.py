"""Build stackforge images: builders (BuildKit / classic), the scheduler, records and verification.

Public interface::

    from stackforge.build import BuildOptions, build_stacks
    summary = build_stacks([(stack, derived), ...], BuildOptions(jobs=2), client=client, progress=True)
    summary.failed      # ids of the stacks that failed
"""

from stackforge.build.options import Builder, BuildOptions
from stackforge.build.records import (
                                      BaseImage,
                                      BuildRecord,
                                      BuildStatus,
                                      BuildSummary,
                                      read_record,
                                      record_path,
)
from stackforge.build.scheduler import build_stacks, choose_builder

__all__ = ["BaseImage", "BuildOptions", "BuildRecord", "BuildStatus", "BuildSummary", "Builder", "build_stacks",
           "choose_builder", "read_record", "record_path"]
