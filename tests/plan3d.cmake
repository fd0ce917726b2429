# plan3d against the labs' records, the papers and bad input (tests/test_plan3d.py).
foreach(case check plan published bounded bad_input bad_files)
  add_lab_test(plan3d_${case} test_plan3d.py ${case})
endforeach()
# the bound is CPU seconds of the Release build: under the sanitizers the same search
# takes 2-3 times longer (4.5-5.1 s against 2.1 s on a Zen 3 core), so .ci/run's
# sanitizer pass leaves it out with the other timings
set_tests_properties(plan3d_bounded PROPERTIES LABELS timing)
# step times and bubbles need the cores to themselves: run alone, skipped when busy
add_lab_test(plan3d_times test_plan3d.py times)
set_tests_properties(plan3d_times PROPERTIES RUN_SERIAL TRUE SKIP_RETURN_CODE 77 LABELS timing)
