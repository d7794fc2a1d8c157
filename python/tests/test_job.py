import pytest

import sparta
from conftest import JOB


def test_a_job_from_a_dict_toml_text_and_a_path_are_the_same(tmp_path):
    j = sparta.Job.from_dict(JOB)
    p = tmp_path / "job.toml"
    p.write_text(j.to_toml())
    for other in (sparta.Job.from_toml(j.to_toml()), sparta.Job.from_path(p), sparta.Job.of(str(p))):
        assert other.to_dict() == j.to_dict()
    assert j.to_dict()["data"]["batch_size"] == 256
    assert j.columns[0] == ("label", "label") and len(j.columns) == 40
    assert j.task_names == ["ctr"]


def test_overrides_merge_key_by_key():
    j = sparta.Job.from_dict(JOB).with_overrides({"train": {"epochs": 3}})
    d = j.to_dict()
    assert d["train"]["epochs"] == 3 and d["train"]["seed"] == 7


@pytest.mark.parametrize(
    "bad, names",
    [
        ({"data": {"batch_size": 0}}, "batch_size"),
        ({"model": {"kind": "nope"}}, "nope"),
        ({"train": {"epohcs": 1}}, "epohcs"),
        ({"data": {"batch_size": "big"}}, "batch_size"),
    ],
)
def test_a_bad_job_is_a_value_error_naming_the_field(bad, names):
    with pytest.raises(ValueError, match=names):
        sparta.Job.from_dict(bad)


def test_bad_toml_and_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="epochs"):
        sparta.Job.from_toml("[train]\nepochs = -1\n")
    with pytest.raises(OSError):
        sparta.Job.from_path(tmp_path / "absent.toml")
    with pytest.raises(TypeError):
        sparta.train(JOB, [], no_such_flag=1)
