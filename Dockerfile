# authlimit: a static binary on a distroless base, running as non-root.
# The build step is `make build`, the same command CI builds and tests with.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN make build VERSION=$VERSION BIN=/out/authlimit

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/authlimit /authlimit
USER nonroot:nonroot
EXPOSE 8080
# The image has no shell or curl: the binary asks itself for /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/authlimit", "-healthcheck"]
ENTRYPOINT ["/authlimit"]
