"""CNI results: one model in the newest schema (1.1.0), converted at print time.

Results of any supported spec version are parsed into the 1.1.0 model (the IPAM
plugin's output, ``prevResult``); the result cni-dra prints is built in that model and
converted once, to the config's ``cniVersion``, when it is written (libcni's
``pkg/types/{020,040,100}`` converters are the reference).

One module per job: :mod:`.model` the objects and their checks, :mod:`.decode` any
version in, :mod:`.encode` the config's version out; every name is importable from
here.

Stdlib only: imported on every CNI call.
"""

from cni_dra.protocol.results.cni_result import DNS, Interface, IPConfig, Result, Route, merge_prev_result
from cni_dra.protocol.results.decode import parse_result
from cni_dra.protocol.results.encode import result_to_dict

__all__ = [
    "Interface",
    "IPConfig",
    "Route",
    "DNS",
    "Result",
    "parse_result",
    "result_to_dict",
    "merge_prev_result",
]
