"""The ``topas`` command line.

``topas`` is a click group (:data:`main`, :mod:`topas.cli.group`); each module here adds its
commands to it::

    topas --version
    topas trace validate FILE_OR_NAME [--profile NAME | --kv-budget N]      (trace.py)
    topas trace describe FILE_OR_NAME
    topas simulate --trace NAME_OR_FILE --policy NAME [--param K=V ...] [--rate R | --load X] ...
    topas simulate ... --engines N --router NAME [--router-param K=V ...]   (simulate.py; a cluster)
    topas policies / topas routers                                         (catalog.py)
    topas capacity WORKLOAD [WORKLOAD...] [--policies P1,P2] [--tasks N] [--seed S] [--load-sat X]
    topas profile-server / topas fidelity                                  (fidelity.py)
    topas serve / topas replay                                             (sglang.py; imports no sglang)

To extend it, define ``@main.command()`` / ``@main.group()`` functions in a module of this
package and import it below. Errors a user can fix are printed as one line on stderr with exit
status 1. A command imports the layers it runs (experiments, workload, policies: pandas and
networkx, about 1 s) inside its function, so ``topas --help`` and the light commands stay fast.
"""

from topas.cli.group import fail, main
from topas.cli import capacity, catalog, fidelity, simulate, trace  # noqa: F401  (registration)
from topas.cli.sglang import replay_cmd, serve_cmd

main.add_command(serve_cmd)
main.add_command(replay_cmd)

__all__ = ["fail", "main"]
