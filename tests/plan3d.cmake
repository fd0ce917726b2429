# plan3d against the labs' records, the papers and bad input (tests/test_plan3d.py).
foreach(case check plan published bounded bad_input bad_files)
  add_lab_test(plan3d_${case} test_plan3d.py ${case})
endforeach()
# step times and bubbles need the cores to themselves: run alone, skipped when busy
add_lab_test(plan3d_times test_plan3d.py times)
set_tests_properties(plan3d_times PROPERTIES RUN_SERIAL TRUE SKIP_RETURN_CODE 77 LABELS timing)
