# The flight recorder, watchdog and hang report (common/flight.h, plots/hang_report.py):
# injected faults, one per kind and lab (quick, ~30 s), every lab with the recorder on and off
# bit for bit, and a wrong count that MPI does not hang on. The whole matrix of faults x labs
# (~2 min on 2 cores) is label long.
foreach(case quick same_bits no_hang)
  add_lab_test(flight_${case} test_flight.py ${case})
endforeach()
add_lab_test(flight_matrix test_flight.py matrix)
set_tests_properties(flight_matrix PROPERTIES LABELS long)
# the recorder's cost per operation (docs/hangs.md): a benchmark, not a test
add_c_test(bench_flight)
# the lesson's claims (docs/hangs.md): its transcripts run as written (~10 s)
add_test(NAME flight_lesson COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/test_lessons.py run
         ${CMAKE_SOURCE_DIR}/docs/hangs.md)
set_tests_properties(flight_lesson PROPERTIES TIMEOUT 300 LABELS lessons
  ENVIRONMENT "${PL_TEST_ENV}")
