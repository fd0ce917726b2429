foreach(case equivalence precision resume dry_run max_memory)
  add_lab_test(lab07_${case} test_lab07.py ${case})
endforeach()
