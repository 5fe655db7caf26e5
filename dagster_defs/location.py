"""The code location (``workspace.yaml``: ``module_name: dagster_defs.location``): Dagster calls
``defs`` when it loads the location, which builds the definitions in ``CQ_SQL_DIR`` with the
translator named by ``CQ_TRANSLATOR``. Importing this module builds nothing."""

import dagster as dg

from .definitions import build_definitions


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
