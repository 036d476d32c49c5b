from __future__ import annotations

from django.contrib import admin

from apps.evidence import models as m

for model in (m.StageResult, m.PlanEvidence, m.LoadReport, m.ShardChecksum, m.LoadProblem, m.OperatorCheck,
              m.AlignmentReport, m.AlignmentOp, m.AlignmentLayer, m.TokenDivergence, m.ServeReport, m.BenchmarkRun,
              m.BenchmarkPoint, m.EnvLock):
    admin.site.register(model, admin.ModelAdmin)
