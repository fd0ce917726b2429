foreach(case equivalence odd schedules precision resume dry_run)
  add_lab_test(lab09_${case} test_lab09.py ${case})
endforeach()
