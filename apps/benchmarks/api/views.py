"""``/api/v1/benchmarks/`` (time series) and ``/api/v1/benchmarks/regressions/`` (flagged runs), JSON or CSV."""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.access import actor_for
from apps.benchmarks.api.renderers import CSVRenderer
from apps.benchmarks.regressions import ParameterError, RegressionRule
from apps.benchmarks.selectors import (
    NotVisible,
    SeriesQuery,
    all_regressions,
    csv_rows,
    load_series,
)
from apps.core.csvfiles import attachment_disposition
from apps.fleet.stacks import series_stack_changes

FILTERS = [
    OpenApiParameter("model", OpenApiTypes.STR, description="model slug"),
    OpenApiParameter("hardware", OpenApiTypes.STR, description="hardware slug"),
    OpenApiParameter("metric", OpenApiTypes.STR, description="metric name(s), e.g. ttft_ms_p50,output_tok_s"),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="points (and flags) from this time"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="points up to this time"),
    OpenApiParameter("concurrency", OpenApiTypes.INT, description="one concurrency level"),
    OpenApiParameter("dtype", OpenApiTypes.STR, description="the jobs' dtype"),
    OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
]
RULE_PARAMS = [
    OpenApiParameter("lookback", OpenApiTypes.INT, description="runs in the baseline (default 14)"),
    OpenApiParameter("min_history", OpenApiTypes.INT, description="runs needed before flagging (default 5)"),
    OpenApiParameter("z_threshold", OpenApiTypes.FLOAT, description="robust z-score to flag (default 3)"),
    OpenApiParameter("latency_ratio", OpenApiTypes.FLOAT, description="latency / baseline median (default 1.2)"),
    OpenApiParameter("throughput_ratio", OpenApiTypes.FLOAT, description="throughput / baseline (default 0.8)"),
    OpenApiParameter("spread_floor", OpenApiTypes.FLOAT, description="spread floor, fraction of the median"),
]


class _BenchmarkView(APIView):
    renderer_classes = [JSONRenderer, CSVRenderer, BrowsableAPIRenderer]

    def _series(self, request: Request) -> list:
        try:
            query = SeriesQuery.from_params(request.query_params)
            rule = RegressionRule.from_params(request.query_params)
            return load_series(actor_for(request), query, rule=rule)
        except NotVisible as exc:
            raise NotFound(str(exc)) from None
        except ParameterError as exc:  # a bad filter or rule parameter: 400 {param: [message]}, as everywhere
            raise ValidationError({exc.param: [str(exc)]}) from None

    def _disposition(self, request: Request, kind: str) -> str:
        return attachment_disposition(kind, *(request.query_params.get(k, "") for k in ("model", "hardware")),
                                      ext="csv")

    def finalize_response(self, request: Request, response: Response, *args, **kwargs) -> Response:  # noqa: ANN002, ANN003
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(request, "accepted_renderer", None) is not None and request.accepted_renderer.format == "csv":
            kind = "regressions" if isinstance(self, RegressionListView) else "benchmarks"
            response["Content-Disposition"] = self._disposition(request, kind)
        return response


class BenchmarkSeriesView(_BenchmarkView):
    """Benchmark time series: one per model, hardware, configuration and metric, with flagged regressions."""

    @extend_schema(parameters=FILTERS + RULE_PARAMS, responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        series = self._series(request)
        if request.accepted_renderer.format == "csv":
            return Response(csv_rows(series))
        return Response({"count": len(series), "series": [s.as_dict() for s in series],
                         "stack_changes": series_stack_changes(series)})  # marks on the time axis


class RegressionListView(_BenchmarkView):
    """Runs flagged as regressions (newest first): a robust z-score over the last N runs of the same model,
    hardware and configuration, together with a minimum relative change against the baseline median."""

    @extend_schema(parameters=FILTERS + RULE_PARAMS, responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        rows = all_regressions(self._series(request))
        if request.accepted_renderer.format == "csv":
            return Response([{k: (v if not isinstance(v, dict) else None) for k, v in r.items() if k != "config"}
                             | r["config"] for r in rows])
        rule = RegressionRule.from_params(request.query_params)
        return Response({"count": len(rows), "rule": asdict(rule), "results": rows})
