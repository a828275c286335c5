# The BLAS libraries a job may ask for (`dlbench run --blas`, models.json's "blas"),
# side by side; the first stays the system's libblas.so.3 (dlbench_runner/blas.py).
COPY runner/dlbench_runner/blas.py /tmp/blas.py
RUN python3 /tmp/blas.py install openblas-pthread openblas-openmp blis-pthread blis-openmp \
      atlas reference \
 && rm /tmp/blas.py
