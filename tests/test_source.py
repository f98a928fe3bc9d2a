from book.env import tour
from studylog import source


def test_diff_between_two_steps_marks_added_lines():
    diff = source.show_diff(tour.scale_step0, tour.scale_step1)
    added = "\n".join(diff.added)
    assert "mask = offs < n" in added
    assert any("tl.load(x_ptr + offs)" in line for line in diff.removed)
    html = diff._repr_html_()
    assert "mask = offs &lt; n" in html
    assert "background: #d7f5dd" in html  # added lines are highlighted
    assert "scale_step0 → scale_step1" in html
    assert "+" in str(diff) and "@@" in str(diff)


def test_identical_sources_say_so():
    diff = source.show_diff(tour.scale_step1, tour.scale_step1)
    assert diff.lines == []
    assert "No difference" in diff._repr_html_()


def test_show_source_of_a_triton_kernel():
    code = source.show_source(tour.scale_step1)
    assert str(code).startswith("@triton.jit")
    assert "<span" in code._repr_html_()  # highlighted


def test_show_one_function_of_a_cuda_file():
    code = source.show_source("tour_axpy.cu", function="axpy_restrict_ldg")
    text = str(code)
    assert "__ldg" in text and "axpy_plain" not in text
    assert text.rstrip().endswith("}")
    diff = source.show_diff("tour_axpy.cu", "tour_axpy.cu", old_function="axpy_plain",
                            new_function="axpy_restrict_ldg")
    assert any("__ldg" in line for line in diff.added)


def test_show_one_struct_of_a_cuda_header():
    text = str(source.show_source("ternary_ring.cuh", function="WeightRing"))
    assert text.lstrip().startswith("//") and "struct WeightRing" in text  # its comment and declaration
    assert "__device__ void fill" in text and "add_warp_sums" not in text
    assert text.rstrip().endswith("}")
