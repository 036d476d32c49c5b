from __future__ import annotations

from django.contrib import admin

from apps.evidence import models as m

for model in (m.StageResult, m.PlanEvidence, m.LoadReport, m.ShardChecksum, m.LoadProblem, m.OperatorCheck,
              m.AlignmentReport, m.AlignmentOp, m.AlignmentLayer, m.TokenDivergence, m.ServeReport, m.BenchmarkRun,
              m.BenchmarkPoint, m.EnvLock):
    admin.site.register(model, admin.ModelAdmin)


@admin.register(m.WeightSamples)
class WeightSamplesAdmin(admin.ModelAdmin):
    """The reference run's secret weight bytes: listed by shard, the bytes themselves never shown."""

    list_display = ("model", "file", "size", "job", "created_at")
    exclude = ("samples",)
    readonly_fields = ("model", "file", "size", "job")


@admin.register(m.WeightDraw)
class WeightDrawAdmin(admin.ModelAdmin):
    """Each attempt's secret draw of byte ranges and the agent's answers (staff only, read only)."""

    list_display = ("job", "attempt", "kind", "created_at")
    exclude = ("spec", "answers", "nonce")
    readonly_fields = ("job", "attempt", "kind")
