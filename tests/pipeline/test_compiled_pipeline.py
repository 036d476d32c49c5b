"""The compiled path through the pipeline: a job's ``bench.compile`` (validated by the jobs API), the serve stage's
compile evidence, the bench stage's compiled-against-eager run and align's compiled-against-eager tokens."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from apps.jobs.api.serializers import JobCreateSerializer


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_job_compile_setting_that_is_not_a_boolean_is_a_400_naming_it(value):
    with pytest.raises(serializers.ValidationError) as err:
        JobCreateSerializer().validate_bench({"compile": value})
    assert "compile" in err.value.detail and "true or false" in str(err.value.detail["compile"][0])


def test_a_job_may_ask_for_the_compiled_path():
    assert JobCreateSerializer().validate_bench({"compile": True, "concurrency": [1]})["compile"] is True
