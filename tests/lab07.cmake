foreach(case equivalence precision resume dry_run)
  add_lab_test(lab07_${case} test_lab07.py ${case})
endforeach()
