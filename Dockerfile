FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleet ./fleet
COPY proxy ./proxy
COPY policies ./policies
COPY rescheduler ./rescheduler
COPY planner ./planner
COPY simulator ./simulator
COPY bench ./bench
RUN pip install --no-cache-dir .
EXPOSE 8000
ENTRYPOINT ["fleet-proxy"]
CMD ["demo", "--host", "0.0.0.0"]
