"""Calibrator names -> classes, for every calibrator but `auto`: the flow family (flow, flow-K, flow+lu,
flow-K+lu) and the linear ones (whitening[-K], sn, natsv-K, sn+natsv-K, none).

`auto` picks one of these by name and saves that name, so it needs this table without the package's factory
(which knows `auto` itself); keeping the table here is what lets `auto` and the factory both use it without
importing each other.
"""

from __future__ import annotations

import inspect

from retriever.calibration.base import FLOW_NAME, Calibrator
from retriever.calibration.linear import make_linear
from retriever.errors import RetrieverError

VALID_NAMES = "auto, flow, flow-K, flow+lu, flow-K+lu, whitening, whitening-K, sn, natsv-K, sn+natsv-K, none"
# Options every calibrator accepts so callers can pass them uniformly; linear calibrators are deterministic
# numpy code and need neither.
COMMON_OPTIONS = ("seed", "device")
# The flow module is imported only when a flow is made or loaded (and torch only when one is fitted, inverted, or
# read from weights saved without their NumPy map): commands that read an index's documents or files pay for neither.


def make_fixed(name: str, **options) -> Calibrator:
    """An unfitted calibrator of a fixed kind (any name but `auto`); keyword options configure the flow."""
    flow_k = FLOW_NAME.match(name)
    if flow_k is not None:
        from retriever.calibration.flow import FlowCalibrator

        if flow_k.group(1) is not None:
            options = {**options, "k": int(flow_k.group(1))}
        if flow_k.group(2) is not None:
            options = {**options, "mixing": "lu"}
        try:
            return FlowCalibrator(**options)
        except TypeError:
            allowed = set(inspect.signature(FlowCalibrator).parameters)
            unknown = sorted(set(options) - allowed)
            raise RetrieverError(
                f"unknown flow option {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}"
            ) from None
    calibrator = make_linear(name)
    if calibrator is None:
        raise RetrieverError(f"unknown calibrator '{name}'; valid names: {VALID_NAMES} (K a positive integer; at "
                             "least 4 for a flow)", parameter="calibrator")
    unknown = sorted(set(options) - set(COMMON_OPTIONS))
    if unknown:
        raise RetrieverError(f"calibrator '{name}' takes no option {', '.join(unknown)}")
    return calibrator


def fixed_class(name: str) -> type[Calibrator] | None:
    """The class that loads a saved calibrator called NAME (not `auto`), or None for an unknown name."""
    if FLOW_NAME.match(name):
        from retriever.calibration.flow import FlowCalibrator

        return FlowCalibrator
    calibrator = make_linear(name)
    return None if calibrator is None else type(calibrator)
