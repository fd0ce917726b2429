foreach(case equivalence precision)
  add_lab_test(lab07_${case} test_lab07.py ${case})
endforeach()
