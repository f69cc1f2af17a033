# authlimit's image: FROM scratch, holding the static binary `make build`
# made, CA certificates and the user 65532. It builds nothing and pulls
# nothing: `make image` (or `make image-context` before `docker build .`)
# first puts what it copies under bin/image, one binary per platform. The
# release builds its multi-platform image from this file the same way.

FROM scratch

ARG TARGETPLATFORM
ARG VERSION=dev
ARG REVISION=unknown

COPY bin/image/rootfs/ /
COPY bin/image/${TARGETPLATFORM}/authlimit /authlimit

LABEL org.opencontainers.image.title="authlimit" \
      org.opencontainers.image.description="A rate limiter that answers a proxy's auth subrequests, deciding in Redis or in memory" \
      org.opencontainers.image.source="https://github.com/authlimit/authlimit" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

# The decision port (AUTHLIMIT_LISTEN's default) and the gRPC port the Helm
# chart gives AUTHLIMIT_GRPC_LISTEN.
EXPOSE 8080 8081
USER 65532:65532
# The image has no shell or curl: the binary asks itself for /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/authlimit", "-healthcheck"]
ENTRYPOINT ["/authlimit"]
