# --sample in every lab (common/sample.c): the same text at every layout as lab01 -n 1.
foreach(case layouts temperature)
  add_lab_test(sample_${case} test_sample.py ${case})
endforeach()
