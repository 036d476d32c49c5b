"""The fits estimates that called a quantised format ``native`` because the hardware declares its element type,
though the runtime has no native path for it (FP4, integer, block FP8, GGUF: dequantised at load), recomputed by
the planner: they now say ``emulated`` with the reason and the bytes that really takes (docs/quantized.md). Cells
of FP8 per tensor / per channel, which the runtime runs natively, keep theirs."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def recompute(apps: Any, schema_editor: Any) -> None:
    from contract.planner import plan_report
    from contract.planner.formats import RUNTIME_NATIVE

    Cell = apps.get_model("matrix", "Cell")
    stale = Cell.objects.filter(fits_plan__quant__mode="native").select_related("model", "hardware")
    for cell in stale.iterator(chunk_size=200):
        if cell.fits_plan.get("quant", {}).get("format") in RUNTIME_NATIVE:
            continue
        hw = cell.hardware
        try:
            report = plan_report(cell.model.config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node,
                                 dtype=cell.fits_plan.get("dtype") or "auto", shared_memory=hw.shared_memory,
                                 hardware_dtypes=list(hw.dtypes or []))
        except Exception as exc:  # noqa: BLE001 - as estimate_fit: a config the planner cannot plan is shown
            cell.fits, cell.fits_devices, cell.fits_plan = None, None, {}
            cell.fits_error = f"{type(exc).__name__}: {exc}"
        else:
            plan, fits = report.get("plan") or {}, bool(report.get("fits"))
            cell.fits, cell.fits_devices = fits, plan.get("devices") if fits else None
            cell.fits_plan = {k: v for k, v in report.items() if k not in ("candidates", "spec")}
            cell.fits_error = ""
        cell.save(update_fields=["fits", "fits_devices", "fits_plan", "fits_error"])


class Migration(migrations.Migration):
    dependencies = [("matrix", "0006_cell_engine")]

    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
